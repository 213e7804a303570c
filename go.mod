module github.com/quarry-cc/quarry

go 1.26

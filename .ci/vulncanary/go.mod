module quarry.invalid/vulncanary

go 1.26

require golang.org/x/text v0.3.7

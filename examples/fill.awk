# fill.awk puts PEM files into the example manifests. Each placeholder @FILE@
# names a file in the working directory:
#   - on a line of its own (a YAML block scalar), the line is replaced by the
#     file's lines, indented as the placeholder was;
#   - inside a JSON string ("@FILE@"), it is replaced by the file's lines
#     joined with \n (PEM needs no other escaping).
# Usage: awk -f fill.awk manifest.yaml > filled.yaml
# POSIX awk (mawk, gawk, busybox); a missing file is an error.

function lines(f,    l, n, r) {
	r = ""
	n = 0
	while ((getline l < f) > 0) {
		r = r l "\n"
		n++
	}
	close(f)
	if (n == 0) {
		printf "fill.awk: %s: missing or empty\n", f > "/dev/stderr"
		exit 1
	}
	return r
}

/^#/ { print; next }

/^[ \t]*@[^@ \t]+@[ \t]*$/ {
	match($0, /@[^@ \t]+@/)
	indent = substr($0, 1, RSTART - 1)
	text = lines(substr($0, RSTART + 1, RLENGTH - 2))
	while ((i = index(text, "\n")) > 0) {
		print indent substr(text, 1, i - 1)
		text = substr(text, i + 1)
	}
	next
}

{
	out = ""
	rest = $0
	while (match(rest, /"@[^@" \t]+@"/)) {
		text = lines(substr(rest, RSTART + 2, RLENGTH - 4))
		json = ""
		while ((i = index(text, "\n")) > 0) {
			json = json substr(text, 1, i - 1) "\\n"
			text = substr(text, i + 1)
		}
		out = out substr(rest, 1, RSTART - 1) "\"" json "\""
		rest = substr(rest, RSTART + RLENGTH)
	}
	print out rest
}

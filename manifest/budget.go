package manifest

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"text/template"
	"text/template/parse"
)

// Template execution limits. MarbleRun has none; a manifest author could make
// the Coordinator crash or spin with a few bytes of template (deep nesting
// overflows the parser's stack, {{range 1000000000}} loops, printf widths
// and repeated doubling allocate without bound). These limits are far above
// what real Files and Env templates need.
const (
	// maxTemplateNesting bounds nested if/range/with/block actions (an
	// else-if chain counts one level per link), checked before parsing.
	maxTemplateNesting = 100
	// maxTemplateWork bounds the work of one Render call or of one whole
	// dry run. Every range iteration and every {{template}} call costs the
	// size of the source it runs (at least minTemplateTick); encoding and
	// printing functions cost the bytes they produce.
	maxTemplateWork = 64 << 20
	minTemplateTick = 256
	// maxTemplateOutput bounds the bytes one Render call or one dry run
	// writes.
	maxTemplateOutput = 64 << 20
	// maxTemplateValue bounds one result of print, printf, println, html,
	// js and urlquery.
	maxTemplateValue = 256 << 10
	// maxTemplateLiteral bounds one string constant in a template.
	maxTemplateLiteral = 64 << 10
	// maxTemplateCalls bounds nested {{template}} calls. Go allows 100000,
	// but an error deep in nested range loops then unwinds in time quadratic
	// in the depth (minutes).
	maxTemplateCalls = 16
	// The functions the budget inserts: tickFunc at the start of every range
	// body, callFunc before and returnFunc after every {{template}} call.
	// Templates cannot call them themselves.
	tickFunc   = "quarryTemplateBudget"
	callFunc   = "quarryTemplateCall"
	returnFunc = "quarryTemplateReturn"
)

var (
	errWorkBudget   = fmt.Errorf("template execution exceeds its work budget of %d units", maxTemplateWork)
	errOutputBudget = fmt.Errorf("template output exceeds %d bytes", maxTemplateOutput)
	errValueSize    = fmt.Errorf("result would exceed %d bytes", maxTemplateValue)
	errLiteralSize  = fmt.Errorf("string constant longer than %d bytes", maxTemplateLiteral)
	errCallDepth    = fmt.Errorf("template calls nested more than %d deep", maxTemplateCalls)
)

// budget is the remaining work and output of template execution.
type budget struct {
	work  int64
	out   int64
	calls int // nested {{template}} calls now running
}

func newBudget() *budget {
	return &budget{work: maxTemplateWork, out: maxTemplateOutput}
}

// charge spends n work units.
func (b *budget) charge(n int64) error {
	b.work -= n
	if b.work < 0 {
		return errWorkBudget
	}
	return nil
}

// charged wraps an encoding function so that its result is paid for.
func (b *budget) charged(fn func(any) (string, error)) func(any) (string, error) {
	return func(v any) (string, error) {
		s, err := fn(v)
		if err != nil {
			return "", err
		}
		if err := b.charge(int64(len(s)) + 1); err != nil {
			return "", err
		}
		return s, nil
	}
}

// funcs returns the budget's tick function and bounded replacements for the
// builtins whose result can be much larger than their input.
func (b *budget) funcs() template.FuncMap {
	return template.FuncMap{
		tickFunc: func(cost int) (string, error) {
			return "", b.charge(int64(max(cost, minTemplateTick)))
		},
		callFunc: func(cost int) (string, error) {
			b.calls++
			if b.calls > maxTemplateCalls {
				return "", errCallDepth
			}
			return "", b.charge(int64(max(cost, minTemplateTick)))
		},
		returnFunc: func() string {
			b.calls--
			return ""
		},
		"print": func(args ...any) (string, error) {
			if err := b.chargeValue(printEstimate(args)); err != nil {
				return "", err
			}
			return fmt.Sprint(args...), nil
		},
		"println": func(args ...any) (string, error) {
			if err := b.chargeValue(printEstimate(args)); err != nil {
				return "", err
			}
			return fmt.Sprintln(args...), nil
		},
		"printf": func(format string, args ...any) (string, error) {
			if err := b.chargeValue(printfEstimate(format, args)); err != nil {
				return "", err
			}
			return fmt.Sprintf(format, args...), nil
		},
		"html": func(args ...any) (string, error) {
			if err := b.chargeValue(6 * printEstimate(args)); err != nil {
				return "", err
			}
			return template.HTMLEscaper(args...), nil
		},
		"js": func(args ...any) (string, error) {
			if err := b.chargeValue(6 * printEstimate(args)); err != nil {
				return "", err
			}
			return template.JSEscaper(args...), nil
		},
		"urlquery": func(args ...any) (string, error) {
			if err := b.chargeValue(3 * printEstimate(args)); err != nil {
				return "", err
			}
			return template.URLQueryEscaper(args...), nil
		},
	}
}

// chargeValue checks an estimated result size against maxTemplateValue and
// pays for it.
func (b *budget) chargeValue(estimate int64) error {
	if estimate > maxTemplateValue {
		return errValueSize
	}
	return b.charge(estimate)
}

// printEstimate is an upper bound for the length of fmt.Sprint(args...) and
// of the %v-style formatting of args: every byte of content takes at most 10
// characters (a byte in %b is 8 digits and a separator), every other element
// at most 64 (a float printed in full).
func printEstimate(args []any) int64 {
	var n int64
	for _, a := range args {
		n += valueSize(reflect.ValueOf(a), 0) + 1
	}
	return n
}

// valueSize estimates the printed size of v (see printEstimate).
func valueSize(v reflect.Value, depth int) int64 {
	if !v.IsValid() {
		return 8
	}
	if depth > 16 {
		return 64
	}
	switch v.Kind() {
	case reflect.String:
		return 10*int64(v.Len()) + 2
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return 10*int64(v.Len()) + 2
		}
		n := int64(2)
		for i := range v.Len() {
			n += valueSize(v.Index(i), depth+1) + 1
		}
		return n
	case reflect.Map:
		n := int64(8)
		it := v.MapRange()
		for it.Next() {
			n += valueSize(it.Key(), depth+1) + valueSize(it.Value(), depth+1) + 2
		}
		return n
	case reflect.Struct:
		n := int64(2)
		for i := range v.NumField() {
			n += valueSize(v.Field(i), depth+1) + 1
		}
		return n
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 8
		}
		return valueSize(v.Elem(), depth+1)
	default:
		return 64
	}
}

// elementCount counts the values fmt formats one by one in v: a verb's
// width applies to each element of a slice, array or map.
func elementCount(v reflect.Value, depth int) int64 {
	if !v.IsValid() || depth > 16 {
		return 1
	}
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return int64(v.Len()) + 1
		}
		n := int64(1)
		for i := range v.Len() {
			n += elementCount(v.Index(i), depth+1)
		}
		return n
	case reflect.Map:
		n := int64(1)
		it := v.MapRange()
		for it.Next() {
			n += elementCount(it.Key(), depth+1) + elementCount(it.Value(), depth+1)
		}
		return n
	case reflect.Struct:
		n := int64(1)
		for i := range v.NumField() {
			n += elementCount(v.Field(i), depth+1)
		}
		return n
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return 1
		}
		return elementCount(v.Elem(), depth+1)
	default:
		return 1
	}
}

// printfEstimate is an upper bound for the length of fmt.Sprintf(format,
// args...): the format itself, the printed arguments, and every verb's width
// and precision applied to every formatted element (fmt caps a width or
// precision at 1e6; '*' takes it from an argument, so it counts as 1e6).
func printfEstimate(format string, args []any) int64 {
	var padding int64
	for i := 0; i < len(format); i++ {
		if format[i] != '%' {
			continue
		}
		i++
		for i < len(format) && strings.IndexByte("+-# 0", format[i]) >= 0 {
			i++
		}
		var num int64
	spec:
		for ; i < len(format); i++ {
			switch c := format[i]; {
			case c >= '0' && c <= '9':
				num = min(num*10+int64(c-'0'), 1e6)
			case c == '*':
				padding += 1e6
			case c == '.', c == '[', c == ']':
				padding += num
				num = 0
			default: // the verb
				break spec
			}
		}
		padding += num
	}
	n := int64(len(format)) + printEstimate(args)
	if padding > 0 {
		var elems int64 = 1
		for _, a := range args {
			elems += elementCount(reflect.ValueOf(a), 0)
		}
		if padding > maxTemplateValue || elems > maxTemplateValue {
			return 2 * maxTemplateValue // too large anyway; avoid overflow
		}
		n += padding * elems
	}
	return n
}

// limitedWriter collects (or, for the dry run, only counts) template output
// within the budget.
type limitedWriter struct {
	b    *budget
	keep bool
	buf  []byte
	nul  bool // a NUL byte was written
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	w.b.out -= int64(len(p))
	if w.b.out < 0 {
		return 0, errOutputBudget
	}
	if slices.Contains(p, 0) {
		w.nul = true
	}
	if w.keep {
		w.buf = append(w.buf, p...)
	}
	return len(p), nil
}

// output is what was written (an empty, non-nil slice when the output is
// kept and nothing was written; nil when it is only counted) and whether
// it holds a NUL byte.
func (w *limitedWriter) output() ([]byte, bool, error) {
	if w.keep && w.buf == nil {
		w.buf = []byte{}
	}
	return w.buf, w.nul, nil
}

// instrument prepares a parsed template for bounded execution: it rejects
// overlong string constants and calls of the budget's own functions, and
// inserts a call of tickFunc at the start of every range body and calls of
// callFunc and returnFunc around every {{template}} call, charging the size
// of the source that will run.
func (b *budget) instrument(t *template.Template) error {
	trees := make(map[string]*parse.Tree)
	for _, tt := range t.Templates() {
		if tt.Tree != nil && tt.Tree.Root != nil {
			trees[tt.Name()] = tt.Tree
		}
	}
	costs := make(map[*parse.ListNode]int64)
	for _, tr := range trees {
		if _, err := listCost(tr.Root, costs); err != nil {
			return err
		}
	}
	for _, tr := range trees {
		insertTicks(tr.Root, costs, trees)
	}
	return nil
}

// listCost returns the source size of a list, recording it (and that of
// every nested list) in costs.
func listCost(l *parse.ListNode, costs map[*parse.ListNode]int64) (int64, error) {
	if l == nil {
		return 0, nil
	}
	var n int64
	for _, node := range l.Nodes {
		c, err := nodeCost(node, costs)
		if err != nil {
			return 0, err
		}
		n += c
	}
	costs[l] = n
	return n, nil
}

func nodeCost(node parse.Node, costs map[*parse.ListNode]int64) (int64, error) {
	switch node := node.(type) {
	case *parse.TextNode:
		return int64(len(node.Text)), nil
	case *parse.ActionNode:
		return pipeCost(node.Pipe)
	case *parse.TemplateNode:
		c, err := pipeCost(node.Pipe)
		return c + 16, err
	case *parse.IfNode:
		return branchCost(&node.BranchNode, costs)
	case *parse.WithNode:
		return branchCost(&node.BranchNode, costs)
	case *parse.RangeNode:
		return branchCost(&node.BranchNode, costs)
	case *parse.ListNode:
		return listCost(node, costs)
	default:
		return 8, nil
	}
}

func branchCost(n *parse.BranchNode, costs map[*parse.ListNode]int64) (int64, error) {
	c, err := pipeCost(n.Pipe)
	if err != nil {
		return 0, err
	}
	l, err := listCost(n.List, costs)
	if err != nil {
		return 0, err
	}
	e, err := listCost(n.ElseList, costs)
	return c + l + e, err
}

func pipeCost(p *parse.PipeNode) (int64, error) {
	if p == nil {
		return 0, nil
	}
	n := int64(8 * (len(p.Decl) + 1))
	for _, cmd := range p.Cmds {
		n += 8
		for _, arg := range cmd.Args {
			c, err := argCost(arg)
			if err != nil {
				return 0, err
			}
			n += c
		}
	}
	return n, nil
}

func argCost(arg parse.Node) (int64, error) {
	switch arg := arg.(type) {
	case *parse.StringNode:
		if len(arg.Text) > maxTemplateLiteral {
			return 0, errLiteralSize
		}
		return int64(len(arg.Text)), nil
	case *parse.PipeNode:
		return pipeCost(arg)
	case *parse.IdentifierNode:
		if arg.Ident == tickFunc || arg.Ident == callFunc || arg.Ident == returnFunc {
			return 0, fmt.Errorf("function %q not defined", arg.Ident)
		}
		return 8, nil
	case *parse.ChainNode:
		c, err := argCost(arg.Node)
		return c + 8*int64(len(arg.Field)), err
	default:
		return 8, nil
	}
}

// insertTicks walks a list and inserts the budget calls.
func insertTicks(l *parse.ListNode, costs map[*parse.ListNode]int64, trees map[string]*parse.Tree) {
	if l == nil {
		return
	}
	nodes := make([]parse.Node, 0, len(l.Nodes))
	for _, node := range l.Nodes {
		switch node := node.(type) {
		case *parse.IfNode:
			insertTicks(node.List, costs, trees)
			insertTicks(node.ElseList, costs, trees)
		case *parse.WithNode:
			insertTicks(node.List, costs, trees)
			insertTicks(node.ElseList, costs, trees)
		case *parse.RangeNode:
			insertTicks(node.List, costs, trees)
			insertTicks(node.ElseList, costs, trees)
			if node.List != nil {
				node.List.Nodes = append([]parse.Node{tickNode(node.List.Position(), node.Line, tickFunc, costs[node.List])}, node.List.Nodes...)
			}
		case *parse.TemplateNode:
			cost := int64(16)
			if tr := trees[node.Name]; tr != nil {
				cost += costs[tr.Root]
			}
			pos, line := node.Position(), node.Line
			nodes = append(nodes, tickNode(pos, line, callFunc, cost), node, tickNode(pos, line, returnFunc, -1))
			continue
		}
		nodes = append(nodes, node)
	}
	l.Nodes = nodes
}

// tickNode builds {{<fn> <cost>}}, or {{<fn>}} for a negative cost.
func tickNode(pos parse.Pos, line int, fn string, cost int64) parse.Node {
	args := []parse.Node{parse.NewIdentifier(fn).SetPos(pos)}
	if cost >= 0 {
		cost = min(cost, 1<<30)
		args = append(args, &parse.NumberNode{
			NodeType: parse.NodeNumber, Pos: pos,
			IsInt: true, IsUint: true, IsFloat: true,
			Int64: cost, Uint64: uint64(cost), Float64: float64(cost),
			Text: fmt.Sprint(cost),
		})
	}
	cmd := &parse.CommandNode{NodeType: parse.NodeCommand, Pos: pos, Args: args}
	pipe := &parse.PipeNode{NodeType: parse.NodePipe, Pos: pos, Line: line, Cmds: []*parse.CommandNode{cmd}}
	return &parse.ActionNode{NodeType: parse.NodeAction, Pos: pos, Line: line, Pipe: pipe}
}

// templateNesting returns how deep text/template's parser would recurse into
// nested if/range/with/block/define actions (and else-if/else-with links)
// of text, without running the parser: a deep enough nesting overflows the
// parser's stack, which is fatal. It follows the lexer's rules for actions,
// comments and quoted strings, and over-estimates rather than under-estimates
// on text the parser would reject.
func templateNesting(text string) int {
	var stack []int // levels opened by each unclosed block
	depth, deepest := 0, 0
	i := 0
	for {
		j := strings.Index(text[i:], "{{")
		if j < 0 {
			return deepest
		}
		i += j + 2
		if len(text)-i >= 2 && text[i] == '-' && isTemplateSpace(text[i+1]) {
			i += 2
		}
		i = skipTemplateSpace(text, i)
		if strings.HasPrefix(text[i:], "/*") {
			k := strings.Index(text[i+2:], "*/")
			if k < 0 {
				return deepest
			}
			i += 2 + k + 2
		} else {
			word, next := templateWord(text, i)
			switch word {
			case "if", "range", "with", "block", "define":
				stack = append(stack, 1)
				depth++
			case "else":
				if w, _ := templateWord(text, skipTemplateSpace(text, next)); w == "if" || w == "with" {
					if len(stack) > 0 {
						stack[len(stack)-1]++
					}
					depth++
				}
			case "end":
				if len(stack) > 0 {
					depth -= stack[len(stack)-1]
					stack = stack[:len(stack)-1]
				}
			}
			deepest = max(deepest, depth)
		}
		i = skipTemplateAction(text, i)
	}
}

func isTemplateSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n'
}

func skipTemplateSpace(text string, i int) int {
	for i < len(text) && isTemplateSpace(text[i]) {
		i++
	}
	return i
}

// templateWord returns the run of ASCII letters, digits and underscores at i.
func templateWord(text string, i int) (string, int) {
	j := i
	for j < len(text) {
		c := text[j]
		if c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' {
			j++
			continue
		}
		break
	}
	return text[i:j], j
}

// skipTemplateAction returns the index after the "}}" that ends the action
// at i, skipping quoted strings, raw strings and character constants.
func skipTemplateAction(text string, i int) int {
	for i < len(text) {
		switch c := text[i]; c {
		case '"', '\'':
			i++
			for i < len(text) && text[i] != c && text[i] != '\n' {
				if text[i] == '\\' {
					i++
				}
				i++
			}
		case '`':
			k := strings.IndexByte(text[i+1:], '`')
			if k < 0 {
				return len(text)
			}
			i += 1 + k
		case '}':
			if i+1 < len(text) && text[i+1] == '}' {
				return i + 2
			}
		}
		i++
	}
	return len(text)
}

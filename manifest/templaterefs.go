package manifest

import (
	"fmt"
	"reflect"
	"strings"
	"text/template/parse"
)

// The dry run refuses a template that names a secret the manifest does not
// define, or a field the template data does not have, even in a branch that
// does not run: text/template would render a missing map entry as nothing
// (or fail only at activation), so a typo in a secret name would pass
// validation and deliver an empty file. checkReferences finds the names
// written in the template; missingkey=error catches the ones reached at run
// time under a changed dot ({{with .Secrets}}{{.typo}}{{end}}).

// checkReferences reports the first field chain in the main tree of a
// template that leaves the template data (TemplateData): a field that does
// not exist, or a secret for which defined is false. It checks chains on the
// root dot (outside range and with bodies), chains on $ (unless the template
// assigns $), and {{index .Secrets "name"}}. Templates made with define or
// block are not checked here: their dot is whatever their caller passes.
func checkReferences(tree *parse.Tree, defined func(string) bool) error {
	if tree == nil || tree.Root == nil {
		return nil
	}
	c := &refChecker{tree: tree, defined: defined, dollarIsRoot: !assignsDollar(tree.Root)}
	return c.list(tree.Root, true)
}

type refChecker struct {
	tree         *parse.Tree
	defined      func(string) bool
	dollarIsRoot bool
}

var (
	templateDataType = reflect.TypeFor[TemplateData]()
	secretsMapType   = reflect.TypeFor[map[string]TemplateSecret]()
)

func (c *refChecker) list(l *parse.ListNode, dotIsRoot bool) error {
	if l == nil {
		return nil
	}
	for _, n := range l.Nodes {
		if err := c.node(n, dotIsRoot); err != nil {
			return err
		}
	}
	return nil
}

func (c *refChecker) node(n parse.Node, dotIsRoot bool) error {
	switch n := n.(type) {
	case *parse.ActionNode:
		return c.pipe(n.Pipe, dotIsRoot)
	case *parse.TemplateNode:
		return c.pipe(n.Pipe, dotIsRoot)
	case *parse.IfNode:
		return c.branch(&n.BranchNode, dotIsRoot, dotIsRoot)
	case *parse.WithNode:
		return c.branch(&n.BranchNode, dotIsRoot, false)
	case *parse.RangeNode:
		return c.branch(&n.BranchNode, dotIsRoot, false)
	case *parse.ListNode:
		return c.list(n, dotIsRoot)
	}
	return nil
}

// branch checks an if, with or range: the pipeline and the else branch see
// the outer dot, the body sees bodyDotIsRoot.
func (c *refChecker) branch(b *parse.BranchNode, dotIsRoot, bodyDotIsRoot bool) error {
	if err := c.pipe(b.Pipe, dotIsRoot); err != nil {
		return err
	}
	if err := c.list(b.List, bodyDotIsRoot); err != nil {
		return err
	}
	return c.list(b.ElseList, dotIsRoot)
}

func (c *refChecker) pipe(p *parse.PipeNode, dotIsRoot bool) error {
	if p == nil {
		return nil
	}
	for _, cmd := range p.Cmds {
		if err := c.command(cmd, dotIsRoot); err != nil {
			return err
		}
	}
	return nil
}

func (c *refChecker) command(cmd *parse.CommandNode, dotIsRoot bool) error {
	if err := c.index(cmd, dotIsRoot); err != nil {
		return err
	}
	for _, arg := range cmd.Args {
		var err error
		switch a := arg.(type) {
		case *parse.FieldNode:
			if dotIsRoot {
				err = c.chain(a, ".", a.Ident)
			}
		case *parse.VariableNode:
			if c.dollarIsRoot && len(a.Ident) > 0 && a.Ident[0] == "$" {
				err = c.chain(a, "$.", a.Ident[1:])
			}
		case *parse.PipeNode:
			err = c.pipe(a, dotIsRoot)
		case *parse.ChainNode:
			if p, ok := a.Node.(*parse.PipeNode); ok {
				err = c.pipe(p, dotIsRoot)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// index checks {{index .Secrets "name"}} and {{index .Previous.Secrets
// "name"}} (also on $).
func (c *refChecker) index(cmd *parse.CommandNode, dotIsRoot bool) error {
	if len(cmd.Args) < 3 {
		return nil
	}
	if fn, ok := cmd.Args[0].(*parse.IdentifierNode); !ok || fn.Ident != "index" {
		return nil
	}
	var path []string
	switch a := cmd.Args[1].(type) {
	case *parse.FieldNode:
		if !dotIsRoot {
			return nil
		}
		path = a.Ident
	case *parse.VariableNode:
		if !c.dollarIsRoot || len(a.Ident) == 0 || a.Ident[0] != "$" {
			return nil
		}
		path = a.Ident[1:]
	default:
		return nil
	}
	key, ok := cmd.Args[2].(*parse.StringNode)
	if !ok || c.defined(key.Text) {
		return nil
	}
	if p := strings.Join(path, "."); p == "Secrets" || p == "Previous.Secrets" {
		return c.errorf(cmd, "%v: %q is not defined in the manifest", errSecretMissing, key.Text)
	}
	return nil
}

// chain follows the field names from the template data's root and reports
// the first one that does not exist.
func (c *refChecker) chain(node parse.Node, root string, idents []string) error {
	t := templateDataType
	for i, name := range idents {
		if hasMethod(t, name) {
			return nil // not in TemplateData today; its result is not followed
		}
		switch {
		case t == secretsMapType:
			if !c.defined(name) {
				return c.errorf(node, "%v: %q is not defined in the manifest", errSecretMissing, name)
			}
			t = t.Elem()
		case t.Kind() == reflect.Struct:
			f, ok := t.FieldByName(name)
			if !ok || !f.IsExported() {
				return c.errorf(node, "%s has no field %s", describeChain(root, idents[:i]), name)
			}
			t = f.Type
		case t.Kind() == reflect.Map, t.Kind() == reflect.Interface:
			return nil
		default:
			return c.errorf(node, "%s has no field %s", describeChain(root, idents[:i]), name)
		}
	}
	return nil
}

func hasMethod(t reflect.Type, name string) bool {
	_, ok := reflect.PointerTo(t).MethodByName(name)
	return ok
}

// describeChain names the value a field was looked up in.
func describeChain(root string, idents []string) string {
	if len(idents) == 0 {
		return "the template data"
	}
	return root + strings.Join(idents, ".")
}

// errorf formats an error like text/template's: "template: <name>:<line>:
// <column>: at <<node>>: <message>".
func (c *refChecker) errorf(node parse.Node, format string, args ...any) error {
	location, context := c.tree.ErrorContext(node)
	return fmt.Errorf("template: %s: at <%s>: %s", location, context, fmt.Sprintf(format, args...))
}

// assignsDollar reports whether a template assigns or declares $ anywhere,
// which makes $ no longer the template data.
func assignsDollar(n parse.Node) bool {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return false
		}
		for _, c := range n.Nodes {
			if assignsDollar(c) {
				return true
			}
		}
	case *parse.ActionNode:
		return pipeAssignsDollar(n.Pipe)
	case *parse.TemplateNode:
		return pipeAssignsDollar(n.Pipe)
	case *parse.IfNode:
		return branchAssignsDollar(&n.BranchNode)
	case *parse.WithNode:
		return branchAssignsDollar(&n.BranchNode)
	case *parse.RangeNode:
		return branchAssignsDollar(&n.BranchNode)
	}
	return false
}

func branchAssignsDollar(b *parse.BranchNode) bool {
	return pipeAssignsDollar(b.Pipe) || assignsDollar(b.List) || assignsDollar(b.ElseList)
}

func pipeAssignsDollar(p *parse.PipeNode) bool {
	if p == nil {
		return false
	}
	for _, v := range p.Decl {
		if len(v.Ident) > 0 && v.Ident[0] == "$" {
			return true
		}
	}
	for _, cmd := range p.Cmds {
		for _, arg := range cmd.Args {
			switch a := arg.(type) {
			case *parse.PipeNode:
				if pipeAssignsDollar(a) {
					return true
				}
			case *parse.ChainNode:
				if inner, ok := a.Node.(*parse.PipeNode); ok && pipeAssignsDollar(inner) {
					return true
				}
			}
		}
	}
	return false
}

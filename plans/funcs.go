package plans

import (
	"os"
	"path/filepath"
	"unicode/utf8"

	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
)

type funcEntry = function.Function

// functions is the function table of a plan loaded from dir: cty's stdlib under the names
// Terraform users know, plus file(), fileexists(), basename() and dirname(), whose relative
// paths resolve against the plan's directory.
func functions(dir string, read func(path string)) map[string]funcEntry {
	resolve := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	fileFunc := function.New(&function.Spec{
		Description: "Reads a UTF-8 text file, relative to the plan's directory.",
		Params:      []function.Parameter{{Name: "path", Type: cty.String}},
		Type:        function.StaticReturnType(cty.String),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			p := resolve(args[0].AsString())
			read(p)
			data, err := readInput(p, MaxFileSize)
			if err != nil {
				return cty.NilVal, function.NewArgError(0, err)
			}
			if !utf8.Valid(data) {
				return cty.NilVal, function.NewArgErrorf(0, "%s is not UTF-8 text", p)
			}
			return cty.StringVal(string(data)), nil
		},
	})
	fileExists := function.New(&function.Spec{
		Params: []function.Parameter{{Name: "path", Type: cty.String}},
		Type:   function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			p := resolve(args[0].AsString())
			read(p)
			_, err := os.Stat(p)
			return cty.BoolVal(err == nil), nil
		},
	})
	pathFunc := func(f func(string) string) function.Function {
		return function.New(&function.Spec{
			Params: []function.Parameter{{Name: "path", Type: cty.String}},
			Type:   function.StaticReturnType(cty.String),
			Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
				return cty.StringVal(f(args[0].AsString())), nil
			},
		})
	}
	return map[string]funcEntry{
		"abs":             stdlib.AbsoluteFunc,
		"basename":        pathFunc(filepath.Base),
		"can":             tryfunc.CanFunc,
		"ceil":            stdlib.CeilFunc,
		"chomp":           stdlib.ChompFunc,
		"coalesce":        stdlib.CoalesceFunc,
		"compact":         stdlib.CompactFunc,
		"concat":          stdlib.ConcatFunc,
		"contains":        stdlib.ContainsFunc,
		"dirname":         pathFunc(filepath.Dir),
		"distinct":        stdlib.DistinctFunc,
		"element":         stdlib.ElementFunc,
		"file":            fileFunc,
		"fileexists":      fileExists,
		"flatten":         stdlib.FlattenFunc,
		"floor":           stdlib.FloorFunc,
		"format":          boundFormat(stdlib.FormatFunc),
		"formatlist":      boundFormat(stdlib.FormatListFunc),
		"indent":          boundIndent(stdlib.IndentFunc),
		"join":            stdlib.JoinFunc,
		"jsondecode":      stdlib.JSONDecodeFunc,
		"jsonencode":      stdlib.JSONEncodeFunc,
		"keys":            stdlib.KeysFunc,
		"length":          stdlib.LengthFunc,
		"lookup":          stdlib.LookupFunc,
		"lower":           stdlib.LowerFunc,
		"max":             stdlib.MaxFunc,
		"merge":           stdlib.MergeFunc,
		"min":             stdlib.MinFunc,
		"parseint":        stdlib.ParseIntFunc,
		"range":           stdlib.RangeFunc,
		"regex":           stdlib.RegexFunc,
		"regexall":        stdlib.RegexAllFunc,
		"regex_replace":   stdlib.RegexReplaceFunc,
		"replace":         stdlib.ReplaceFunc,
		"reverse":         stdlib.ReverseListFunc,
		"setintersection": stdlib.SetIntersectionFunc,
		"setunion":        stdlib.SetUnionFunc,
		"slice":           stdlib.SliceFunc,
		"sort":            stdlib.SortFunc,
		"split":           stdlib.SplitFunc,
		"strrev":          stdlib.ReverseFunc,
		"substr":          stdlib.SubstrFunc,
		"title":           stdlib.TitleFunc,
		"tobool":          stdlib.MakeToFunc(cty.Bool),
		"tolist":          stdlib.MakeToFunc(cty.List(cty.DynamicPseudoType)),
		"tomap":           stdlib.MakeToFunc(cty.Map(cty.DynamicPseudoType)),
		"tonumber":        stdlib.MakeToFunc(cty.Number),
		"toset":           stdlib.MakeToFunc(cty.Set(cty.DynamicPseudoType)),
		"tostring":        stdlib.MakeToFunc(cty.String),
		"trim":            stdlib.TrimFunc,
		"trimprefix":      stdlib.TrimPrefixFunc,
		"trimspace":       stdlib.TrimSpaceFunc,
		"trimsuffix":      stdlib.TrimSuffixFunc,
		"try":             tryfunc.TryFunc,
		"upper":           stdlib.UpperFunc,
		"values":          stdlib.ValuesFunc,
		"zipmap":          stdlib.ZipmapFunc,
	}
}

func (l *loader) funcTable() map[string]function.Function { return l.funcs }

// FunctionNames lists the functions a plan may call, for the documentation test.
func FunctionNames() []string {
	var out []string
	for n := range functions(".", func(string) {}) {
		out = append(out, n)
	}
	return out
}

// boundFormat refuses format strings whose widths or precisions pass MaxFormatWidth
// before cty allocates them.
func boundFormat(f function.Function) function.Function {
	return bound(f, func(args []cty.Value) error {
		if len(args) == 0 {
			return nil
		}
		if v, _ := args[0].Unmark(); v.IsKnown() && !v.IsNull() && v.Type() == cty.String {
			if err := formatWidthOK(v.AsString()); err != nil {
				return function.NewArgError(0, err)
			}
		}
		return nil
	})
}

// boundIndent refuses an indent() of more than MaxIndent spaces.
func boundIndent(f function.Function) function.Function {
	return bound(f, func(args []cty.Value) error {
		if len(args) == 0 {
			return nil
		}
		if v, _ := args[0].Unmark(); v.IsKnown() && !v.IsNull() && v.Type() == cty.Number {
			if n, _ := v.AsBigFloat().Int64(); n > MaxIndent || n < 0 || !v.AsBigFloat().IsInt() {
				return function.NewArgErrorf(0, "indent of %s spaces: at most %d", v.AsBigFloat().String(), MaxIndent)
			}
		}
		return nil
	})
}

// bound wraps f's implementation with a check of its arguments.
func bound(f function.Function, check func([]cty.Value) error) function.Function {
	spec := &function.Spec{
		Description: f.Description(),
		Params:      f.Params(),
		VarParam:    f.VarParam(),
		Type: func(args []cty.Value) (cty.Type, error) {
			return f.ReturnTypeForValues(args)
		},
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			if err := check(args); err != nil {
				return cty.NilVal, err
			}
			return f.Call(args)
		},
	}
	return function.New(spec)
}

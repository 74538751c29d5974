#!/usr/bin/env python3
"""Generate the fake SGLang's flag table from SGLang's own server_args.py.

    python3 scripts/gen-sglang-flags.py PATH/TO/sglang/python/sglang/srt/server_args.py \
        --label "sgl-project/sglang@COMMIT" > internal/fakesglang/flags_gen.go
    gofmt -l internal/fakesglang   # prints nothing

The fake (internal/fakesglang) must accept exactly what the real parser accepts and
refuse what it refuses, with the real types, aliases, choices and nargs, so a command
line that runs on SGLang runs on the fake and a typo fails the same way. Rather than
copy the flags by hand, this script reads the parser's definition: it parses the file
with Python's ast module (SGLang itself is never imported: it needs torch and a GPU)
and collects every `parser.add_argument(...)` call, resolving what argparse would:

  - option strings ("--tp-size", "--tensor-parallel-size");
  - type= (int, float, str, json.loads, json_list_type, human_readable_int,
    nullable_str; anything else is read as a string);
  - action= (store_true, store_false, BooleanOptionalAction, and SGLang's own
    DeprecatedAction / DeprecatedStoreTrueAction, which take no value);
  - nargs= ("?", "*", "+", or a count), required=, choices= (a literal list, or a
    module-level list such as LOAD_FORMAT_CHOICES; choices computed at run time,
    e.g. from a plugin registry, are not checked);
  - default= (a literal, or ServerArgs.field resolved to the dataclass default);
  - the program name given to ArgumentParser(prog=...) in prepare_server_args.

Later SGLang moved the fields to annotated dataclass fields (A[T, Arg(...)] or
A[T, "help"]) that arg_groups/arg_utils.py turns into arguments; those are read too,
in the file and in the files given with --extra (arg_groups/fields/*.py), by the
same rules: the flag is Arg(cli_name=) or the field name with dashes, plus
Arg(aliases=); Optional[T] is T; Literal[...] gives the choices; List[T] takes
nargs="+"; bool is store_true; Arg(type_parser=, choices=, nargs=, action=,
required=) apply; a field without a default is required; no_cli=True is skipped.

Standard library only. Output is Go, already gofmt-formatted.
"""

import argparse
import ast
import sys

TYPES = {
    "int": "typeInt",
    "float": "typeFloat",
    "str": "typeStr",
    "nullable_str": "typeStr",
    "json.loads": "typeJSON",
    "json_list_type": "typeJSON",
    "human_readable_int": "typeHumanInt",
}

NO_VALUE_ACTIONS = {
    "'store_true'": "typeBool",
    "'store_false'": "typeBool",
    "'store_const'": "typeBool",
    "'count'": "typeBool",
    "DeprecatedAction": "typeBool",
    "DeprecatedStoreTrueAction": "typeBool",
    "DeprecatedStoreConstAction": "typeBool",
    "argparse.BooleanOptionalAction": "typeBoolOpt",
}


def literal(node, names):
    """The value of a literal node, a module-level name bound to one, or None."""
    try:
        return ast.literal_eval(node)
    except Exception:
        pass
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    return None


def module_literals(tree):
    """Module-level NAME = literal assignments (choice lists, constants)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                out[node.targets[0].id] = ast.literal_eval(node.value)
            except Exception:
                pass
    return out


def class_defaults(tree, cls="ServerArgs"):
    """Literal defaults of the ServerArgs dataclass fields."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    try:
                        out[item.target.id] = ast.literal_eval(item.value)
                    except Exception:
                        pass
    return out


def go_str(v):
    if isinstance(v, bool):
        return '"true"' if v else '"false"'
    s = str(v)
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def spec_from_call(call, names, defaults):
    opts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if not opts or not all(o.startswith("-") for o in opts):
        return None  # a positional argument: SGLang's server parser has none
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    typ = "typeStr"
    if "type" in kw:
        typ = TYPES.get(ast.unparse(kw["type"]), "typeStr")
    if "action" in kw:
        a = ast.unparse(kw["action"])
        if a in NO_VALUE_ACTIONS:
            typ = NO_VALUE_ACTIONS[a]
        elif a == "'append'":
            pass  # one value each time, kept as given
    nargs = ""
    if "nargs" in kw:
        n = literal(kw["nargs"], names)
        nargs = "" if n is None else str(n)
        if n == 0:
            typ, nargs = "typeBool", ""
    choices = None
    if "choices" in kw:
        c = literal(kw["choices"], names)
        if isinstance(c, (list, tuple, set, frozenset)):
            choices = [str(x) for x in c]
            if isinstance(c, (set, frozenset)):
                choices.sort()
    required = "required" in kw and literal(kw["required"], names) is True
    default = None
    if "default" in kw:
        d = kw["default"]
        if isinstance(d, ast.Attribute) and isinstance(d.value, ast.Name) and d.value.id == "ServerArgs":
            default = defaults.get(d.attr)
        else:
            default = literal(d, names)
    elif typ != "typeBool" and "dest" not in kw:
        field = opts[0].lstrip("-").replace("-", "_")
        default = defaults.get(field)
    return {"names": opts, "typ": typ, "nargs": nargs, "choices": choices,
            "required": required, "default": default}


def unwrap_optional(node):
    """Optional[T] and T | None are T."""
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("Optional", "typing.Optional"):
        return node.slice
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        if ast.unparse(node.right) == "None":
            return node.left
        if ast.unparse(node.left) == "None":
            return node.right
    return node


def scalar_type(name):
    return {"int": "typeInt", "float": "typeFloat"}.get(name, "typeStr")


def annotated_specs(tree, names):
    """Fields written as NAME: A[T, Arg(...)] = default (the later dataclass layout),
    built the way arg_groups/arg_utils.py's add_cli_args_from_dataclass builds them."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            ann = item.annotation
            if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated", "typing.Annotated")):
                continue
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if len(elts) < 2:
                continue
            meta = elts[1]
            if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
                kw = {k.arg: k.value for k in meta.keywords if k.arg}
            elif isinstance(meta, ast.Constant) and isinstance(meta.value, str):
                kw = {}  # A[T, "help"]: an argument with help only
            else:
                continue
            if "no_cli" in kw and literal(kw["no_cli"], names) is True:
                continue
            cli = literal(kw["cli_name"], names) if "cli_name" in kw else None
            opts = [cli or "--" + item.target.id.replace("_", "-")]
            if "aliases" in kw:
                al = literal(kw["aliases"], names)
                if isinstance(al, (list, tuple)):
                    opts += [str(x) for x in al]
            # The default: a literal, field(default=...), or field(default_factory=...).
            has_default, default = item.value is not None, None
            if isinstance(item.value, ast.Call) and ast.unparse(item.value.func).endswith("field"):
                fkw = {k.arg: k.value for k in item.value.keywords if k.arg}
                has_default = "default" in fkw or "default_factory" in fkw
                if "default" in fkw:
                    default = literal(fkw["default"], names)
            elif item.value is not None:
                default = literal(item.value, names)
            choices = None
            if "choices" in kw:
                c = literal(kw["choices"], names)
                if isinstance(c, (list, tuple, set, frozenset)):
                    choices = [str(x) for x in c]
            nargs = ""
            if "nargs" in kw:
                n = literal(kw["nargs"], names)
                nargs = "" if n is None else str(n)
            parser_type = TYPES.get(ast.unparse(kw["type_parser"]), "typeStr") if "type_parser" in kw else None
            inner = unwrap_optional(elts[0])
            required = False
            if "action" in kw:
                typ = NO_VALUE_ACTIONS.get(ast.unparse(kw["action"]), "typeStr")
            elif isinstance(inner, ast.Subscript) and ast.unparse(inner.value) in ("Literal", "typing.Literal"):
                vals = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
                vals = [literal(v, names) for v in vals]
                choices = choices or [str(v) for v in vals]
                typ = parser_type or ("typeInt" if vals and isinstance(vals[0], int) and not isinstance(vals[0], bool) else "typeStr")
            elif isinstance(inner, ast.Subscript) and ast.unparse(inner.value) in ("List", "list", "typing.List") and parser_type is None:
                typ = scalar_type(ast.unparse(inner.slice))
                nargs = nargs or "+"
            elif ast.unparse(inner) == "bool":
                typ = "typeBool"
            else:
                typ = parser_type or scalar_type(ast.unparse(inner))
                req = literal(kw["required"], names) if "required" in kw else None
                required = req is True or (req is None and not has_default)
            out.append({"names": opts, "typ": typ, "nargs": nargs, "choices": choices,
                        "required": required, "default": default})
    return out


def parser_prog(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "prepare_server_args":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call) and ast.unparse(sub.func).endswith("ArgumentParser"):
                    for k in sub.keywords:
                        if k.arg == "prog" and isinstance(k.value, ast.Constant):
                            return k.value.value
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("server_args", help="SGLang's python/sglang/srt/server_args.py")
    ap.add_argument("--extra", action="append", default=[], help="more files with annotated fields (arg_groups/fields/*.py)")
    ap.add_argument("--label", default="", help="where the source came from, for the header (repository@commit)")
    args = ap.parse_args()

    with open(args.server_args, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = module_literals(tree)
    defaults = class_defaults(tree)
    trees = [tree]
    for path in args.extra:
        with open(path, encoding="utf-8") as f:
            t = ast.parse(f.read())
        names.update(module_literals(t))
        trees.append(t)

    specs, seen = [], set()
    for t in trees:
        for node in ast.walk(t):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                s = spec_from_call(node, names, defaults)
                if s:
                    specs.append(s)
        specs += annotated_specs(t, names)
    out_specs = []
    for s in specs:
        if any(n in seen for n in s["names"]):
            continue  # argparse would refuse a duplicate; the first definition wins
        seen.update(s["names"])
        if s["typ"] == "typeBoolOpt":
            s["names"] = s["names"] + ["--no-" + n[2:] for n in s["names"] if n.startswith("--")]
        out_specs.append(s)
    if len(out_specs) < 50:
        sys.exit("gen-sglang-flags: only %d flags found in %s: not SGLang's server_args.py, or a layout this script does not read" % (len(out_specs), args.server_args))

    w = sys.stdout.write
    w("// Code generated by scripts/gen-sglang-flags.py; DO NOT EDIT.\n")
    if args.label:
        w("// Source: %s, python/sglang/srt/server_args.py.\n" % args.label)
    w("\npackage main\n\n")
    w("// parserProg is the prog= SGLang gives its ArgumentParser (\"\" when it gives none).\n")
    w("const parserProg = %s\n\n" % go_str(parser_prog(tree)))
    w("// specs are SGLang's server flags, %d of them, in the order --help lists them.\n" % len(out_specs))
    w("var specs = []argSpec{\n")
    for s in out_specs:
        parts = ["names: []string{%s}" % ", ".join(go_str(n) for n in s["names"])]
        if s["typ"] != "typeStr":
            parts.append("typ: " + s["typ"])
        if s["nargs"]:
            parts.append("nargs: " + go_str(s["nargs"]))
        if s["choices"] is not None:
            parts.append("choices: []string{%s}" % ", ".join(go_str(c) for c in s["choices"]))
        if s["required"]:
            parts.append("required: true")
        d = s["default"]
        if d is not None and s["typ"] != "typeBool" and not isinstance(d, (list, dict, tuple)) and str(d) != "":
            parts.append("def: " + go_str(d))
        w("\t{" + ", ".join(parts) + "},\n")
    w("}\n")


if __name__ == "__main__":
    main()

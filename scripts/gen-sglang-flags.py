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

Later SGLang moved some fields to annotated dataclass fields (A[T, Arg(...)]) built
into arguments by arg_groups/arg_utils.py; those are read too when the file (or a
file given with --extra) has them: the flag is the field name with dashes, bool
fields are store_true, Arg(aliases=..., choices=..., nargs=..., action=...) apply,
and no_cli=True fields are skipped.

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


def annotated_specs(tree, names):
    """Fields written as NAME: A[T, Arg(...)] = default (the later dataclass layout)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            ann = item.annotation
            if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name) and ann.value.id in ("A", "Annotated")):
                continue
            elts = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            if len(elts) < 2:
                continue
            base = ast.unparse(elts[0])
            meta = elts[1]
            kw = {}
            if isinstance(meta, ast.Call) and ast.unparse(meta.func) == "Arg":
                kw = {k.arg: k.value for k in meta.keywords if k.arg}
            if "no_cli" in kw and literal(kw["no_cli"], names) is True:
                continue
            flag = "--" + item.target.id.replace("_", "-")
            opts = [flag]
            if "aliases" in kw:
                al = literal(kw["aliases"], names)
                if isinstance(al, (list, tuple)):
                    opts += [str(a) for a in al]
            default = None
            if item.value is not None:
                default = literal(item.value, names)
            typ = "typeStr"
            for k, v in (("bool", "typeBool"), ("int", "typeInt"), ("float", "typeFloat")):
                if base == k or base == "Optional[%s]" % k:
                    typ = v
            if "type_parser" in kw:
                typ = TYPES.get(ast.unparse(kw["type_parser"]), typ)
            if "action" in kw:
                typ = NO_VALUE_ACTIONS.get(ast.unparse(kw["action"]), typ)
            nargs = ""
            if "nargs" in kw:
                n = literal(kw["nargs"], names)
                nargs = "" if n is None else str(n)
            elif base.startswith("List[") or base.startswith("Optional[List["):
                nargs = "+"
            choices = None
            if "choices" in kw:
                c = literal(kw["choices"], names)
                if isinstance(c, (list, tuple)):
                    choices = [str(x) for x in c]
            required = item.value is None and typ != "typeBool"
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

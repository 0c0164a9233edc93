#!/usr/bin/env python3
"""Writes src/protobuf/schema.rs: the layout of the Kubernetes protobuf messages Shepherd speaks.

Field numbers and types come from the prost structs of the `k8s-pb` crate; JSON names from the
serde code of `k8s-openapi` (proto field names are the JSON names, which prost turns into snake
case and so loses `podIP` vs `podIp`). Both crates are read from the local cargo registry:

    cargo fetch   # in any project that depends on k8s-pb 0.9 and k8s-openapi 0.29
    python3 crates/apiserver/tools/protobuf_schema.py > crates/apiserver/src/protobuf/schema.rs
"""
import glob
import os
import re
import sys

REGISTRY = os.path.expanduser("~/.cargo/registry/src")
PB = sorted(glob.glob(f"{REGISTRY}/*/k8s-pb-0.9.*"))[-1] + "/src"
OPENAPI = sorted(glob.glob(f"{REGISTRY}/*/k8s-openapi-0.29.*"))[-1] + "/src"

# Packages whose every message is included (and whatever they reference). A new API group is one line.
PACKAGES = [
    "api/core/v1", "api/apps/v1", "api/coordination/v1", "api/autoscaling/v1", "api/autoscaling/v2", "api/policy/v1", "api/batch/v1",
    "api/discovery/v1", "apimachinery/pkg/apis/meta/v1", "apimachinery/pkg/runtime",
    "apimachinery/pkg/util/intstr", "apimachinery/pkg/api/resource",
]

# Go structs embedded with `json:",inline"` carried as a field in protobuf while JSON spreads their fields
# into the embedding object. Those without a JSON definition of their own take the embedding one's names.
INLINE = {
    "k8s.io.api.core.v1.VolumeSource": "io.k8s.api.core.v1.Volume",
    "k8s.io.api.core.v1.ProbeHandler": "io.k8s.api.core.v1.Probe",
    "k8s.io.api.core.v1.EphemeralContainerCommon": "io.k8s.api.core.v1.EphemeralContainer",
    "k8s.io.api.core.v1.PersistentVolumeSource": "io.k8s.api.core.v1.PersistentVolumeSpec",
}


def package_of(module_dir):
    return "k8s.io." + module_dir.replace("_", "-").replace("/", ".")


def parse_module(module_dir):
    """{message: [(tag, snake, kind, label, rust_type)]} of one k8s-pb module."""
    text = open(f"{PB}/{module_dir}/mod.rs").read()
    messages = {}
    for m in re.finditer(r'pub struct (\w+) \{(.*?)\n\}', text, re.S):
        fields = []
        body = m.group(2) + "\n"
        field = r'#\[prost\(([^\]]*)\)\]\s*pub (r#)?(\w+):\s*(.*?),\n(?=    ///|    #\[|$)'
        for fm in re.finditer(field, body, re.S):
            attr, name, rtype = fm.group(1), fm.group(3), " ".join(fm.group(4).split())
            tag = int(re.search(r'tag = "(\d+)"', attr).group(1))
            fields.append((tag, name, attr, rtype))
        messages[m.group(1)] = fields
    return messages


def resolve(module_dir, rust_type):
    """The full proto name of the message a Rust type path names, seen from `module_dir`."""
    path = re.sub(r'::prost::alloc::(boxed::Box|vec::Vec|collections::BTreeMap)<|::core::option::Option<|>', '', rust_type)
    path = [p.strip() for p in path.split(",") if p.strip()][-1]
    parts = path.split("::")
    base = module_dir.split("/")
    while parts and parts[0] == "super":
        parts.pop(0)
        base.pop()
    return package_of("/".join(base + parts[:-1])) + "." + parts[-1], "/".join(base + parts[:-1])


def openapi_names():
    """{io.k8s...Definition: {lowercase-without-separators: jsonName}} from k8s-openapi, newest version last."""
    names = {}
    for version in sorted(os.listdir(OPENAPI)):
        if not version.startswith("v1_"):
            continue
        for path in glob.glob(f"{OPENAPI}/{version}/**/*.rs", recursive=True):
            text = open(path).read()
            d = re.search(r'// Generated from definition (\S+)', text)
            if not d:
                continue
            # prost spells `PodIP` as `PodIp`: definitions are matched without regard to case.
            entry = names.setdefault(d.group(1).lower(), {})
            for j in re.findall(r'"([^"]+)" => Field::Key_', text):
                entry[j.replace("_", "").replace("-", "").lower()] = j
    return names


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def main():
    json_names = openapi_names()
    modules, todo, seen = {}, [], set()
    for pkg in PACKAGES:
        modules[pkg] = parse_module(pkg)
        todo += [(pkg, name) for name in modules[pkg]]
    out = []
    while todo:
        module_dir, name = todo.pop(0)
        full = package_of(module_dir) + "." + name
        if full in seen:
            continue
        seen.add(full)
        if module_dir not in modules:
            modules[module_dir] = parse_module(module_dir)
        definition = INLINE.get(full, "io.k8s." + full[len("k8s.io."):])
        known = json_names.get(definition.lower())
        if known is None:
            print(f"no JSON names for {full}: camel case assumed", file=sys.stderr)
            known = {}
        fields = []
        for tag, snake, attr, rtype in modules[module_dir][name]:
            kind = attr.split(",")[0].strip()
            json = known.get(snake.replace("_", "").lower())
            # A message field the JSON definition lacks is an embedded struct (`LocalObjectReference`).
            embedded = json is None and bool(known) and kind == "message"
            if json is None and known and not embedded:
                print(f"{full}.{snake} has no JSON name: camel case assumed", file=sys.stderr)
            json = json or camel(snake)
            kind = attr.split(",")[0].strip()
            repeated = "repeated" in attr
            if kind.startswith("btree_map") or kind.startswith("map"):
                value = re.search(r'"string, (\w+)"', attr).group(1)
                if value == "message":
                    target, tdir = resolve(module_dir, rtype)
                    todo.append((tdir, target.rsplit(".", 1)[1]))
                    ty = f'Map(&Msg("{target}"))'
                else:
                    ty = {"string": "Map(&Str)", "bytes": "Map(&Bytes)"}[value]
            elif kind == "message":
                target, tdir = resolve(module_dir, rtype)
                todo.append((tdir, target.rsplit(".", 1)[1]))
                ty = f'Msg("{target}")'
            else:
                ty = {"string": "Str", 'bytes = "vec"': "Bytes", "bool": "Bool", "int32": "I32", "int64": "I64",
                      "double": "F64"}[kind]
            constructor = "rep" if repeated else "one"
            if embedded:
                constructor = "inline"
            fields.append(f'{constructor}({tag}, "{json}", {ty})')
        out.append((full, fields))
    print("//! Layout of the Kubernetes protobuf messages: field numbers, JSON names and types.")
    print("//! Generated by `tools/protobuf_schema.py` from the k8s-pb and k8s-openapi crates; do not edit.")
    print()
    print("use super::Ty::*;")
    print("use super::{Message, inline, one, rep};")
    print()
    print("pub(super) static MESSAGES: &[Message] = &[")
    for full, fields in sorted(out):
        print(f'    Message {{ name: "{full}", fields: &[')
        for f in fields:
            print(f"        {f},")
        print("    ] },")
    print("];")


if __name__ == "__main__":
    sys.exit(main())

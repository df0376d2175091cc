"""Import circles among the top-level modules of a Rust crate, or the modules of a Python package.

Issue 38's check that arrows only point down. In Rust it reads `crate::X` paths (for a folder
module a/b of a crate, `crate::a::b::X`), and `super::X` in the folder's own files, outside
comments and `#[cfg(test)]`; in a Python package (a folder with
`__init__.py`) every module's `import` and `from ... import` of the package's own modules (a
name imported from a package that is one of its modules counts as that module). It prints each
group of modules that import one another (a strongly connected component of more than one).
Run: `python3 tools/import_circles.py sim/src sim/src/predict exec/src src python/syncopate`.
"""

import ast

import os
import re
import sys
from collections import defaultdict


def crate_path(src):
    """`crate::` for a crate's source folder, `crate::a::b::` for its folder module a/b."""
    parts, here = [], os.path.abspath(src)
    while not any(os.path.exists(os.path.join(here, f)) for f in ("lib.rs", "main.rs")):
        parts.insert(0, os.path.basename(here))
        parent = os.path.dirname(here)
        if parent == here:
            return "crate::"
        here = parent
    return "crate::" + "".join(part + "::" for part in parts)


def top_modules(src):
    """The folder's modules: its files and folders besides lib.rs, main.rs and mod.rs."""
    modules = set()
    for name in os.listdir(src):
        if name.endswith(".rs") and name not in ("lib.rs", "main.rs", "mod.rs"):
            modules.add(name[:-3])
        elif os.path.isdir(os.path.join(src, name)):
            modules.add(name)
    return modules


def imports(src, modules):
    """Module -> the other top-level modules its non-test code names."""
    edges = defaultdict(set)
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            relative = os.path.relpath(path, src)
            first = relative.split(os.sep)[0]
            module = first[:-3] if first.endswith(".rs") else first
            if module not in modules:
                continue
            with open(path) as file:
                text = file.read().split("#[cfg(test)]")[0]
            # Comments (doc links included) name modules without importing them.
            text = re.sub(r"//.*", "", text)
            patterns = [r"\b" + re.escape(crate_path(src)) + r"(\w+)"]
            if os.sep not in relative:
                patterns.append(r"\bsuper::(\w+)")
            for pattern in patterns:
                for match in re.finditer(pattern, text):
                    target = match.group(1)
                    if target in modules and target != module:
                        edges[module].add(target)
    return edges


def python_imports(package):
    """The package's modules (dotted names) and module -> the package's modules it imports."""
    top = os.path.dirname(os.path.abspath(package))
    modules = {}
    for root, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                dotted = os.path.relpath(path, top)[:-3].replace(os.sep, ".")
                modules[dotted.removesuffix(".__init__")] = path
    edges = defaultdict(set)
    for module, path in modules.items():
        with open(path) as file:
            tree = ast.parse(file.read())
        here = module if path.endswith("__init__.py") else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = here.split(".")[: len(here.split(".")) - max(node.level - 1, 0)]
                named = ".".join(base + [node.module]) if node.level and node.module else None
                source = named or (".".join(base) if node.level else node.module or "")
                targets = [
                    f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source
                    for alias in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges[module].update(t for t in targets if t in modules and t != module)
    return set(modules), edges


def circles(nodes, edges):
    """Tarjan's strongly connected components of more than one node, each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def main(folders):
    for src in folders:
        if os.path.exists(os.path.join(src, "__init__.py")):
            modules, edges = python_imports(src)
        else:
            modules = top_modules(src)
            edges = imports(src, modules)
        found = circles(modules, edges)
        print(f"{src}: {len(modules)} modules, {len(found)} circles")
        for component in found:
            print("  " + " <-> ".join(component))


if __name__ == "__main__":
    main(sys.argv[1:])

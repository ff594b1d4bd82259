"""Each code block of the docs carries its own imports (issue 60 item 17): a
reader who copies one block gets the modules it names.  The blocks of a page
still share their values in page order (see tests/test_docs.py, which runs
them); a module a block uses (a name some block of the docs imports) is
imported in that block itself."""

import ast
import os

import pytest

import test_docs

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(test_docs.DOCS, "conf.py")),
                                reason="no docs/ here (the tests of an installed wheel)")


def _imported(tree):
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            names.update(a.asname or a.name for a in n.names)
    return names


def _blocks():
    for path in test_docs.markdown_files():
        for line, code, _ in test_docs.python_blocks(path):
            if not code.lstrip().startswith(">>>"):
                yield os.path.relpath(path, test_docs.ROOT), line, ast.parse(code)


def test_every_block_imports_the_modules_it_uses():
    blocks = list(_blocks())
    modules = set().union(*(_imported(t) for _, _, t in blocks))
    assert {"kiln", "np", "torch"} <= modules
    missing = []
    for path, line, tree in blocks:
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        own = _imported(tree) | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                                 and not isinstance(n.ctx, ast.Load)}
        lacking = sorted((used & modules) - own)
        if lacking:
            missing.append("%s:%d %s" % (path, line, ", ".join(lacking)))
    assert missing == []


def test_the_dask_blocks_say_how_to_install_dask():
    for page in ("records-container.md", "integrations.md"):
        with open(os.path.join(test_docs.DOCS, page), encoding="utf-8") as f:
            assert 'pip install "kiln-wire[dask]"' in f.read(), page

"""Sphinx configuration for the kiln documentation site.

Build: ``sphinx-build -W -n --keep-going -b html docs docs/_build/html``
(``tests/test_docs.py`` runs exactly that, so the test suite fails on any
warning or broken cross-reference).  Why Sphinx and not MkDocs: see
``docs/about-docs.md``.
"""

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))   # the checkout's kiln, also without an install

import kiln  # noqa: E402

project = "kiln"
author = "the kiln authors"
copyright = "the kiln authors, MIT licence"
release = version = kiln.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# MyST: "```python" fences stay plain code blocks (tests/test_docs.py runs
# them); headings get anchors so pages can link to sections.
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# autodoc: signatures keep their annotations; members in source order
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
# kiln.torch.distributed subclasses torch's DCP storage classes, so importing
# it imports torch, which is in none of kiln's extras: where torch is missing
# (the README's test command), autodoc reads that module against a stand-in
try:
    import torch  # noqa: F401
except ImportError:
    autodoc_mock_imports = ["torch"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# The builtin theme: nothing to install beyond Sphinx itself.
html_theme = "alabaster"
html_title = "kiln %s" % release
html_static_path = []
# alabaster's default body (at most 800 px) scrolls a 100-character code line
# sideways; this width holds MAX_CODE_LINE characters of its code font
# (tests/test_docs.py keeps every code line in docs/ and README.md to it)
MAX_CODE_LINE = 100
html_theme_options = {"description": "Kiln wire format for Python",
                      "fixed_sidebar": False, "show_relbars": True,
                      "page_width": "1260px", "sidebar_width": "240px",
                      "body_max_width": "none", "code_font_size": "0.85em"}

# -n (nitpicky) turns every unresolved reference into a warning, and -W into
# an error.  The build has no network, so no intersphinx: names from Python,
# numpy and typing cannot be linked and are ignored here.  References to
# kiln's own names are never ignored: a broken one fails the build.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(?!kiln\b).*"),
]

nitpick_ignore = [
    ("py:class", "kiln._api.T"),   # the TypeVar of Encoder[T] / Decoder[T]
    ("py:class", "kiln.records.writer.T"),   # RecordWriter[T]
    ("py:class", "kiln._files.load.T"),   # kiln.load(path, R) -> R
    ("py:class", "kiln._files.base.T"),   # KilnFile.get(name, default)
    ("py:class", "kiln.records.reader.R"),   # RecordFile[R]
    ("py:class", "kiln.records.stream.R"),   # StreamDecoder[R]
]

# Public names live in private modules (kiln._types.Type is documented as
# kiln.Type), and kiln.files.Tensor is kiln.Tensor; the subclasses of Type
# that the constructors return are documented as kiln.Type.
_PUBLIC = {name: "kiln." + name for name in kiln.__all__}
_PUBLIC.update({name: "kiln.Type" for name in ("Struct", "List", "Opt", "Dict", "Scalar")})


def _resolve_private(app, env, node, contnode):
    """Point ``kiln.<module>.Name`` at ``kiln.Name`` when Name is public."""
    target = node.get("reftarget", "")
    if node.get("refdomain") != "py" or not target.startswith("kiln.") or target.count(".") < 2:
        return None
    public = _PUBLIC.get(target.rsplit(".", 1)[-1])
    if public is None:
        return None
    py = env.get_domain("py")
    return py.resolve_xref(env, node.get("refdoc", ""), app.builder, node["reftype"], public,
                           node, contnode)


def setup(app):
    app.connect("missing-reference", _resolve_private)

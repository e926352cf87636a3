"""Batch inference on a real (local) two-node Ray cluster, each node with its own ``RLX_*`` policy.

Node A allows only ``cpu``; node B prefers ``fakeaccel``, a test-only accelerator plugin
installed for both nodes through ``PYTHONPATH`` (it computes with the reference
interpreter, and ``RLXTEST_FAKEACCEL`` in a job's ``runtime_env`` makes it fail or kill
its own worker once). One cluster serves the whole module and is always shut down.
Deselect with ``-m "not ray"``; skipped when Ray Data is not installed.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import mlp, other_plugins_disabled

import rlx_core as rlx
from rlx_core import reference

pytestmark = pytest.mark.ray

ROWS, BLOCKS = 64, 8

FAKEACCEL = '''
"""A test-only accelerator: computes with the reference; RLXTEST_FAKEACCEL makes it misbehave."""
import os
import signal

import rlx_core as rlx
from rlx_core import reference
from rlx_core.ir.ops import COMPOSITE_OPS, PRIMITIVE_OPS


class _Run(rlx.Executable):
    def __init__(self, graph):
        self.graph = graph

    def run(self, inputs):
        mode = os.environ.get("RLXTEST_FAKEACCEL", "")
        if mode == "fail":
            raise RuntimeError("fakeaccel lost its device")
        if mode.startswith("die-once-then-fail:"):
            try:
                os.close(os.open(mode.split(":", 1)[1], os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                raise RuntimeError("fakeaccel lost its device") from None
            else:
                os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-job, once
        outs = reference.evaluate(self.graph, inputs)
        return [o.astype(self.graph.node(i).dtype) for o, i in zip(outs, self.graph.outputs)]


class FakeAccel(rlx.Backend):
    name = "fakeaccel"
    label = "test accelerator"
    priority = 60

    def probe(self):
        return rlx.Availability(True, devices=["fakeaccel"])

    def supported_ops(self):
        return frozenset(op.value for op in PRIMITIVE_OPS | COMPOSITE_OPS)

    def cost_model(self):
        return rlx.CostModel(device="fakeaccel", sgemm_gflops=1e4, memory_bw_gbps=1e3, dispatch_overhead_ns=1000,
                             roundtrip_overhead_ns=1000)

    def compile(self, graph, options):
        return _Run(graph)


@rlx.hookimpl
def rlx_backends():
    return [FakeAccel()]
'''


def _site(root: Path) -> Path:
    site = root / "site"
    site.mkdir()
    (site / "rlxtest_fakeaccel.py").write_text(textwrap.dedent(FAKEACCEL))
    info = site / "rlxtest_fakeaccel-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlxtest-fakeaccel\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[rlx.backends]\nfakeaccel = rlxtest_fakeaccel\n")
    return site


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'rlx-core[ray]')")
    pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'rlx-core[ray]')")
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("ray")
    paths = [str(_site(root)), *filter(None, [os.environ.get("PYTHONPATH")])]
    common = {"PYTHONPATH": os.pathsep.join(paths), "RLX_DISABLE_PLUGINS": other_plugins_disabled(),
              "RLX_CACHE_DIR": str(root / "cache")}
    # Two logical CPUs per node: with one, the actor pool starves Ray Data's read tasks.
    # One "rlx_slot" per node puts exactly one worker on each node when a job asks for it.
    # A small object store per node: the rows are tiny, and CI machines have little /dev/shm.
    node = {"num_cpus": 2, "resources": {"rlx_slot": 1}, "object_store_memory": 128 * 1024**2}
    cluster = Cluster(initialize_head=True, head_node_args={
        **node, "include_dashboard": False, "env_vars": {**common, "RLX_DEVICES": "cpu"},
    })
    ctx = None
    try:
        cluster.add_node(**node, env_vars={**common, "RLX_PREFER_DEVICES": "fakeaccel"})
        ray.init(address=cluster.address, log_to_driver=False)
        ctx = ray.data.DataContext.get_current()
        saved = (ctx.enable_progress_bars, ctx.wait_for_min_actors_s)
        ctx.enable_progress_bars = False
        ctx.wait_for_min_actors_s = 120  # start a job only once both nodes' workers are up
        yield cluster
    finally:
        if ctx is not None:
            ctx.enable_progress_bars, ctx.wait_for_min_actors_s = saved
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def rows() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(11).standard_normal((ROWS, 8)).astype(np.float32)
    ids = np.arange(ROWS, dtype=np.int64) * 3 + 1
    return x, ids


def dataset(rows: tuple[np.ndarray, np.ndarray]) -> Any:
    import pyarrow as pa
    import ray

    x, ids = rows
    tables = [pa.table({"x": pa.FixedShapeTensorArray.from_numpy_ndarray(xs), "id": pa.array(i)})
              for xs, i in zip(np.array_split(x, BLOCKS), np.array_split(ids, BLOCKS))]
    return ray.data.from_arrow(tables)


def collect(ds: Any) -> dict[str, np.ndarray]:
    parts = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def check_every_row_once(out: dict[str, np.ndarray], rows: tuple[np.ndarray, np.ndarray]) -> None:
    """Exactly the input's rows (by id, none lost, none twice), each equal to the reference."""
    x, ids = rows
    assert len(out["id"]) == ROWS
    assert sorted(out["id"].tolist()) == sorted(ids.tolist())
    one = mlp(1)
    by_id = {int(i): row for i, row in zip(ids, x)}
    for i, probs in zip(out["id"], out["probs"]):
        want = reference.evaluate(one, {"x": by_id[int(i)][None]})[0][0]
        np.testing.assert_allclose(probs, want, rtol=1e-5, atol=1e-6)


def one_worker_per_node() -> dict[str, Any]:
    return {"concurrency": 2, "resources": {"rlx_slot": 1}}


def test_each_node_runs_on_the_device_its_own_policy_picks(ray_cluster, rows) -> None:
    from rlx_core.distributed import map_batches

    out = collect(map_batches(dataset(rows), mlp(4), **one_worker_per_node()))
    check_every_row_once(out, rows)
    devices = set(out["rlx_device"].tolist())
    assert devices == {"cpu", "fakeaccel"}, devices  # node A: RLX_DEVICES=cpu; node B: prefers fakeaccel


def test_a_killed_worker_costs_a_retry_and_a_failing_device_a_fallback_never_a_row(ray_cluster, rows,
                                                                                     tmp_path: Path) -> None:
    """Node B's worker is killed by its first batch; restarted, its device fails from then on.

    Ray restarts the worker and redoes its batches (none lost, none twice); the new worker
    falls back to cpu there, and the device column says so.
    """
    from rlx_core.distributed import map_batches

    marker = tmp_path / "killed-once"
    env = {"env_vars": {"RLXTEST_FAKEACCEL": f"die-once-then-fail:{marker}"}}
    out = collect(map_batches(dataset(rows), mlp(4), runtime_env=env, **one_worker_per_node()))
    assert marker.exists()  # a worker really died
    check_every_row_once(out, rows)
    assert set(out["rlx_device"].tolist()) == {"cpu"}  # node B's rows say where they really ran


def test_strict_mode_fails_the_job_with_a_device_error_naming_node_and_device(ray_cluster, rows) -> None:
    from rlx_core.distributed import map_batches
    from rlx_core.distributed._ray import rlx_error_from

    env = {"env_vars": {"RLXTEST_FAKEACCEL": "fail", "RLX_STRICT": "1"}}
    ds = map_batches(dataset(rows), mlp(4), runtime_env=env, **one_worker_per_node())
    with pytest.raises(Exception) as info:
        ds.materialize()
    cause = rlx_error_from(info.value)
    assert isinstance(cause, rlx.DeviceError), repr(info.value)
    assert "device fakeaccel failed" in str(cause) and "node " in str(cause) and "RLX_STRICT" in str(cause)


def test_cli_with_ray(ray_cluster, rows, tmp_path: Path, capsys) -> None:
    from rlx_core.cli import main

    x, ids = rows
    mlp(4).save(tmp_path / "mlp.json")
    np.savez(tmp_path / "in.npz", x=x, id=ids)
    out_path = tmp_path / "out.parquet"
    try:
        main(["batch", str(tmp_path / "mlp.json"), str(tmp_path / "in.npz"), str(out_path), "--ray",
              ray_cluster.address, "--concurrency", "2"])
    except SystemExit as exc:
        assert exc.code in (0, None), capsys.readouterr().err
    printed = capsys.readouterr().out
    assert f"{ROWS} rows" in printed and "rows/s" in printed
    from rlx_core.distributed.tables import open_source

    parts = list(open_source(out_path).batches(1000))
    out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    check_every_row_once(out, rows)
    assert set(out["rlx_device"].tolist()) <= {"cpu", "fakeaccel"}

    np.savez(tmp_path / "bad.npz", x=x.astype(np.float64), id=ids)
    with pytest.raises(SystemExit) as info:
        main(["batch", str(tmp_path / "mlp.json"), str(tmp_path / "bad.npz"), str(tmp_path / "o.npz"), "--ray",
              ray_cluster.address])
    assert info.value.code == 2
    assert "column 'x': expected dtype float32" in capsys.readouterr().err
    assert not (tmp_path / "o.npz").exists()


def test_map_batches_checks_its_arguments_before_any_job(ray_cluster, rows) -> None:
    import ray

    from rlx_core.distributed import map_batches

    ds = dataset(rows)
    bad = [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": (3, 1)}, "minimum exceeds"),
        ({"batch_format": "pandas"}, "numpy"),
        ({"compute": ray.data.ActorPoolStrategy(size=1), "concurrency": 2}, "not both"),
        ({"fn_constructor_args": ()}, "sets fn_constructor_args itself"),
        ({"batch_size": 0}, "batch_size"),
        ({"policy": "cpu"}, "policy"),
    ]
    for kwargs, match in bad:
        with pytest.raises(rlx.ConfigError, match=match):
            map_batches(ds, mlp(4), **kwargs)
    with pytest.raises(rlx.ConfigError, match=r"ray\.data\.Dataset"):
        map_batches([1, 2], mlp(4))
    with pytest.raises(rlx.ModelError):
        map_batches(ds, b"not a model")

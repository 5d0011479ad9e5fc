"""The real TPU compiler from this CPU host (libtpu's abstract devices of a slice, `training/aot.py`):
the tiny and modern tiny train steps compiled for a v5e:2x2 as data=4 and as fsdp=2 x tensor=2,
splash attention lowered by Mosaic on global and local layers, a fine-tuning step, multi-slice
over DCN, the collectives read from the compiled HLO against programs whose traffic is known,
the HBM table against the compiler's own limit, and the one-line errors (no fit, no libtpu, a
name the compiler refuses)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import finetune, train
from bert_jax.models import model
from bert_jax.training import aot, collectives, programs
from configs import finetune_classification, modern_tiny, tiny
from suite_flags import xla_flags
from tests import forked_launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPOLOGY = "v5e:2x2"  # 4 chips of TPU v5 lite.


@pytest.fixture(scope="module")
def v5e():
  return aot.topology_target(TOPOLOGY)


def _config(module, mesh: tuple[int, int, int], **model_fields):
  config = module.get_config()
  config.data.source = "synthetic"
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh
  config.model.update(model_fields)
  return config


@pytest.fixture(scope="module")
def modern_data4(v5e):
  """modern_tiny (global + local layers, no attention dropout: splash in training) as data=4."""
  return train.compile_report(_config(modern_tiny, (4, 1, 1)), v5e)


def test_modern_tiny_compiles_for_a_v5e_slice_with_splash_through_mosaic(v5e, modern_data4):
  """The default path that stopped at init at d16959b: "auto" takes splash on the TPU, and the
  init's batch of 1 meets a data axis of 4. Forward (global + local layers) and the backward's
  dq and dkv kernels are Mosaic custom calls, none interpreted; init takes the plain path."""
  report = modern_data4
  assert (report["topology"], report["device_kind"], report["devices"]) == (
      TOPOLOGY, "TPU v5 lite", 4)
  assert report["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
  # "auto" decided for the target, not for this CPU host (where it is "xla").
  assert report["attention_impl"] == report["attention_in_training"] == "splash"
  assert model.resolve_attention_impl(model.BertConfig(), length=128) == "xla"
  kernels = report["mosaic_kernels"]
  assert kernels["init"] == 0
  assert kernels["eval"] >= 2  # A global and a local kernel.
  assert kernels["train"] >= 3 * kernels["eval"] // 2  # Forward, dq and dkv.
  assert report["fits"] is True and report["hbm_gib"] == 15.75
  assert 0 < report["train_arguments_gib"] < report["per_device_gib"] < 1.0
  assert report["model_flops_per_chip"] == report["model_flops_per_step"] / 4 > 0
  # Data parallel: the gradients are all-reduced, the params never gathered.
  assert report["collectives"]["all-reduce"]["count"] >= 1
  assert report["collectives"]["all-gather"]["count"] == 0
  assert report["collective_unknown_trip_counts"] == 0
  bound = report["estimated_step_seconds_lower_bound"]
  assert bound == max(report[f"estimated_{k}_seconds"] for k in ("compute", "hbm", "ici", "dcn"))
  assert 0 < report["estimated_mfu_ceiling"] <= 1.0


def test_tiny_compiles_as_fsdp_times_tensor_with_explicit_splash(v5e):
  """The failure of d16959b: attention_impl='splash' made init trace a length of 2. BERT's
  attention dropout keeps training on the einsum path; evaluation takes splash, its heads split
  over tensor inside the kernel's shard_map."""
  report = train.compile_report(_config(tiny, (1, 2, 2), attention_impl="splash"), v5e)
  assert report["fits"] is True and report["attention_impl"] == "splash"
  assert report["attention_in_training"] == "einsum (attention dropout)"
  assert report["mesh"] == {"data": 1, "fsdp": 2, "tensor": 2}
  kernels = report["mosaic_kernels"]
  assert kernels["init"] == kernels["train"] == 0 and kernels["eval"] > 0
  # FSDP gathers the params in the step; tensor parallelism reduces partial sums.
  assert report["collectives"]["all-gather"]["count"] > 0
  assert report["collectives"]["all-reduce"]["count"] > 0


def test_a_fine_tuning_step_compiles_for_the_slice(v5e):
  config = finetune_classification.get_config()
  config.model.update(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128)
  config.data.labels = ("neg", "pos", "neutral")
  config.mesh.data, config.mesh.fsdp = 2, 2
  report = finetune.compile_report(config, v5e)
  assert (report["task"], report["labels"], report["encoder"]) == ("classification", 3, "scratch")
  assert "labels_assumed" not in report
  assert report["fits"] is True and report["attention_impl"] == "splash"
  assert report["model_flops_per_step"] > 0
  assert report["collectives"]["all-gather"]["count"] > 0  # fsdp=2.


def test_two_slices_put_the_data_axis_on_dcn():
  target = aot.topology_target(TOPOLOGY, num_slices=2)
  assert len(target.devices) == 8 and {d.slice_index for d in target.devices} == {0, 1}
  config = _config(tiny, (-1, 1, 1))
  with pytest.raises(ValueError, match=r"^--num_slices=2 needs config.mesh.dcn_data=2"):
    train.compile_report(config, target)
  config.mesh.dcn_data = 2
  report = train.compile_report(config, target, steps=("train",))  # Its gradients' all-reduce.
  assert report["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1} and report["num_slices"] == 2
  assert report["estimated_dcn_bytes_per_chip"] > 0  # The gradients' all-reduce spans slices.


# ------------------------------------------------------------------ the collectives' reading


def _compile_on(target, mesh_shape, function, *specs):
  mesh = jax.sharding.Mesh(np.asarray(target.devices).reshape(mesh_shape), ("x", "y")[
      :len(mesh_shape)])
  with jax.set_mesh(mesh):
    shaped = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))
              for shape, dtype, spec in specs]
    return jax.jit(function).lower(*shaped).compile(), mesh


def test_collectives_of_known_programs(v5e):
  """A sum over a sharded axis is one all-reduce of the result; a scan that gathers a sharded
  matrix in each of its 5 iterations counts 5 all-gathers of the whole matrix."""
  compiled, _ = _compile_on(v5e, (4,), lambda x: jnp.sum(x, axis=0),
                            ((4, 1024), jnp.float32, PartitionSpec("x", None)))
  found = collectives.collectives(compiled.as_text(), [0] * 4)
  assert (found["all-reduce"]["count"], found["all-reduce"]["bytes"]) == (1, 1024 * 4)
  assert found["all-reduce"]["sent_bytes_per_chip"] == 2 * 3 / 4 * 1024 * 4

  def gathered(w, x):  # w [256, 512] split over x's rows; gathered whole in every iteration.
    def body(carry, _):
      full = jax.lax.with_sharding_constraint(w, PartitionSpec())
      return carry + jnp.sum(full * carry[0, 0]), None
    return jax.lax.scan(body, x, None, length=5)[0]

  compiled, _ = _compile_on(v5e, (4,), gathered,
                            ((256, 512), jnp.float32, PartitionSpec("x", None)),
                            ((8, 128), jnp.float32, PartitionSpec()))
  found = collectives.collectives(compiled.as_text(), [0] * 4)
  assert found["unknown_trip_counts"] == []
  assert found["all-gather"]["count"] in (1, 5)  # Hoisted out of the loop, or once a trip.
  assert found["all-gather"]["bytes"] == found["all-gather"]["count"] * 256 * 512 * 4


def test_a_persistent_cache_neither_warns_nor_stands_in_for_a_compile(v5e, tmp_path):
  """JAX_COMPILATION_CACHE_DIR (set on many TPU VMs, and by this suite) cannot load what was
  compiled for abstract devices: jax warns on every such program's second compile. The reports'
  compiles bypass the cache; the host's programs use it again afterwards."""
  import warnings  # pylint: disable=import-outside-toplevel
  from jax._src import compilation_cache as cache_state  # pylint: disable=import-outside-toplevel

  def compile_twice():
    for _ in range(2):
      _compile_on(v5e, (4,), lambda x: jnp.sum(x * 3.0, axis=0),
                  ((4, 256), jnp.float32, PartitionSpec("x", None)))

  previous = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", str(tmp_path))
  cache_state.reset_cache()
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      compile_twice()  # Without the guard: the fault.
    assert any("Error reading persistent compilation cache" in str(w.message) for w in caught)
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      with aot._without_persistent_cache():  # pylint: disable=protected-access
        compile_twice()
    jax.jit(lambda x: x * 5.0)(jnp.ones(3))  # A host program after it: cached again.
    assert cache_state.is_cache_used(jax.devices()[0].client)
  finally:
    jax.config.update("jax_compilation_cache_dir", previous)
    cache_state.reset_cache()


def test_replica_group_notations():
  assert collectives.replica_groups("replica_groups={{0,1},{2,3}}, x", 4) == [[0, 1], [2, 3]]
  assert collectives.replica_groups("replica_groups=[2,2]<=[4], x", 4) == [[0, 1], [2, 3]]
  assert collectives.replica_groups("replica_groups=[2,2]<=[2,2]T(1,0), x", 4) == [[0, 2],
                                                                                   [1, 3]]
  assert collectives.replica_groups(
      "replica_groups=mesh['a'=2,'b'=2] {'a'}, x", 4) == [[0, 2], [1, 3]]
  assert collectives.replica_groups(
      "replica_groups=mesh['a'=2,'b'=2] {'a','b'}, x", 4) == [[0, 1, 2, 3]]
  assert collectives.replica_groups("source_target_pairs={{0,1},{1,0}}", 4) == [[0, 1], [1, 0]]


def test_the_hbm_table_is_the_compilers_limit(v5e):
  """CHIPS' hbm_gib is what the TPU compiler reports as available when a program is too big."""
  def big(x):  # Temporaries far beyond any chip: a [200, 4096, 4096] cumulative sum.
    spread = jnp.broadcast_to(x[None], (200, *x.shape)) + jnp.arange(200.0)[:, None, None]
    return jnp.cumsum(spread, axis=0)[::7].sum(0)
  mesh = jax.sharding.Mesh(np.asarray(v5e.devices[:1]), ("x",))
  with jax.set_mesh(mesh):
    spec = jax.ShapeDtypeStruct((4096, 4096), jnp.float32,
                                sharding=NamedSharding(mesh, PartitionSpec()))
    with pytest.raises(aot.DoesNotFit) as refused:
      aot._compile(jax.jit(big).lower(spec), "probe")  # pylint: disable=protected-access
  assert refused.value.available_gib == aot.CHIPS["TPU v5 lite"].hbm_gib
  assert refused.value.needed_gib > 10


def test_the_tpu_extra_pins_the_libtpu_of_jaxs_own_tpu_extra():
  """requirements-tpu.txt (pyproject's `tpu` extra) against the installed jax's [tpu] extra."""
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  wanted = next(r for r in importlib.metadata.requires("jax")
                if r.startswith("libtpu") and 'extra == "tpu"' in r)
  prefix = wanted.split("==")[1].split(";")[0].strip().rstrip("*")  # "0.0.42."
  with open(os.path.join(ROOT, "requirements-tpu.txt")) as f:
    pin = next(line.split("#")[0].strip() for line in f if line.startswith("libtpu=="))
  assert pin.split("==")[1].startswith(prefix), (pin, wanted)
  assert importlib.metadata.version("libtpu") == pin.split("==")[1]


# ------------------------------------------------------------------ what an operator meets


def _launch(*args, config="configs/tiny.py"):
  env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
  return forked_launch.run([sys.executable, "launch/train.py", f"--config={config}",
                         "--config.data.source=synthetic", *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_a_config_that_does_not_fit_is_one_error_line_after_its_report(tmp_path):
  done = _launch("--compile_only", f"--topology={TOPOLOGY}",
                 "--config.train.batch_size=4194304", f"--workdir={tmp_path}")
  assert done.returncode == 1, done.stderr
  lines = [line for line in done.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith(
      "error: the config does not fit v5e:2x2: it needs at least "), lines
  assert "GiB per chip, more than the 15.75 GiB of TPU v5 lite HBM" in lines[0]
  for field in ("config.train.batch_size (now 4194304, 1048576 per chip)",
                "config.train.grad_accum_steps", "config.model.remat='full'", "config.mesh.fsdp"):
    assert field in lines[0]
  assert '"fits": false' in done.stdout
  assert os.listdir(tmp_path) == []  # Nothing written.


def test_topology_errors_are_one_line(monkeypatch):
  with pytest.raises(ValueError, match=r"^--topology='v5e-8' is not a TPU slice: use "):
    aot.target("v5e-8")
  with pytest.raises(ValueError, match=r"^--topology='v5e:1x1': the TPU compiler refuses it"):
    aot.target("v5e:1x1")
  with pytest.raises(ValueError, match=r"^--num_slices needs --topology"):
    aot.target("", 2)
  monkeypatch.setitem(sys.modules, "libtpu", None)  # As without the tpu extra.
  with pytest.raises(ValueError, match=r"^--topology needs libtpu, the TPU compiler: pip install "
                                       r"-e '.\[tpu\]' \(or -r requirements-tpu.txt\)$"):
    aot.target("v5e:2x2")


@pytest.mark.parametrize("args,line", [
    (("--topology=v5e:2x2",), "error: --topology, --num_slices and --compile_steps need "
                              "--compile_only (a run trains on the devices it is on)"),
    (("--compile_only", "--compile_steps=eval,init"),
     "error: --compile_steps=eval,init: give some of init,train,eval, each once, train among "
     "them")])
def test_compile_flags_out_of_place_are_refused(args, line):
  done = _launch(*args)
  assert done.returncode == 2
  assert done.stderr.strip() == line


def test_the_train_step_alone_is_the_quick_check_of_a_batch(v5e):
  """--compile_steps=train (the benchmark's search): the train step's memory is the report's,
  and no init or eval step was compiled."""
  config = _config(tiny, (4, 1, 1))
  report = train.compile_report(config, v5e, ("train",))
  assert report["compile_steps"] == ["train"] and report["fits"] is True
  assert report["per_device_gib"] == report["train_total_gib"] > 0
  assert not any(k.startswith(("init_", "eval_")) and k.endswith("_gib") for k in report)
  assert list(report["mosaic_kernels"]) == ["train"]
  assert report["compile_seconds"] == report["compile_seconds_train"]


def test_explicit_splash_trains_through_the_launcher_on_data_4(tmp_path):
  """d16959b stopped at init with attention_impl='splash' (a length of 2 refused) on every
  backend, and on a data x fsdp > 1 mesh splash's shard_map refused init's batch of 1."""
  env = dict(os.environ, XLA_FLAGS=xla_flags(4), JAX_PLATFORMS="cpu")
  done = forked_launch.run(
      [sys.executable, "launch/train.py", "--config=configs/tiny.py",
       "--config.data.source=synthetic", "--config.model.attention_impl=splash",
       "--config.model.attention_probs_dropout_prob=0.0", "--config.train.num_train_steps=2",
       "--config.train.eval_every_steps=0", "--config.mesh.data=4",
       f"--workdir={tmp_path}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "Attention: 'splash' where no attention dropout applies" in done.stdout + done.stderr
  assert "step 2/2" in done.stdout + done.stderr

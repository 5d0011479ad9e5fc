r"""Per-device memory of the compiled train step for BERT-Base and BERT-Large at L=128 and 512,
from XLA's memory analysis of an AOT compile against abstract shapes (nothing is allocated).

  python benchmarks/memory.py            # 1 device (CPU here); use --devices=8 --fsdp=8 to shard

The figures are the CPU backend's; a GPU/TPU compile differs somewhat (fusion, layouts), and
the launcher prints the real ones for the chip it runs on (`launch/train.py --compile_only`).
"""

import json
import os
import sys

from absl import app, flags

flags.DEFINE_integer("devices", 1, "Forced CPU devices (set before jax starts).")
flags.DEFINE_integer("fsdp", 1, "Size of the fsdp mesh axis (the rest is data).")
flags.DEFINE_string("dtype", "bfloat16", "Compute dtype.")
flags.DEFINE_string("output", "", "Also write the JSON lines here.")


def main(argv):
  del argv
  f = flags.FLAGS
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={f.devices}"
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from configs import base, large  # pylint: disable=g-import-not-at-top

  rows = []
  for name, module in (("base", base), ("large", large)):
    for seq_len, per_device_batch, predictions in ((128, 32, 20), (512, 8, 80)):
      config = module.get_config()
      config.model.dtype = f.dtype
      config.data.max_seq_length = seq_len
      config.masking.max_predictions_per_seq = predictions
      config.train.batch_size = per_device_batch * f.devices
      config.mesh.fsdp = f.fsdp
      report = train.compile_report(config)
      row = {"model": name, "seq_len": seq_len, "batch_per_device": per_device_batch,
             "dtype": f.dtype, **report}
      rows.append(row)
      print(json.dumps(row), flush=True)
  print(f"\n| model | L | batch/device | params+opt state GiB | temporaries GiB | total GiB |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['model']} | {r['seq_len']} | {r['batch_per_device']} | {r['train_arguments_gib']:.2f} "
          f"| {r['train_temporaries_gib']:.2f} | {r['train_total_gib']:.2f} |")
  if f.output:
    with open(f.output, "w") as out:
      out.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
  app.run(main)

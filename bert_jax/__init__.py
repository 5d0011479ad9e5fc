"""bert_jax: BERT pretraining in JAX/Flax. `import bert_jax` stays cheap: submodules load on use."""


def load_pretrained(*args, **kwargs):
  """See `bert_jax.weights.load_pretrained`: (config, params, vocab) from a bert_jax,
  training-workdir, HuggingFace or TensorFlow checkpoint."""
  from bert_jax import weights  # pylint: disable=import-outside-toplevel
  return weights.load_pretrained(*args, **kwargs)

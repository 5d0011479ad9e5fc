"""Sampling from a masked-diffusion (or any MLM-headed) encoder: start from all-[MASK] after the
prompt and unmask over `steps` steps of the reverse process, inside one jitted `lax.fori_loop`.

Rules (`RULES`), at each step from time t to s < t of the current block (times 1 - k / n over the
block's n steps):
- "ancestral" (MDLM): every masked position of the block is unmasked with probability
  (alpha_s - alpha_t) / (1 - alpha_t) = (t - s) / t (the same for the linear and log-linear
  schedules), its token drawn from the model's distribution at that position; the last step
  (s = 0) unmasks what is left. Committed tokens never change (MDLM's carry-over).
- "confidence" (LLaDA's low-confidence remasking): a token is drawn at every masked position of
  the block, and the ones the model gives the highest probability are kept, as many as the step
  allows (the block's tokens spread evenly over its steps, LLaDA's `get_num_transfer_tokens`);
  the rest stay [MASK].
Semi-autoregressive blocks (`block_size`; LLaDA): the canvas is cut into blocks filled left to
right, each with its share of the steps (the first `steps % blocks` blocks get one more); a later
block stays [MASK] (and is read as such) until its turn.

Draws: temperature (0: the most probable token), then top-k and top-p (nucleus) filtering, then
Gumbel-max with keys fold_in(key, step), so a seed gives one text. Control tokens and [UNK] are
never drawn.

What it does not guarantee: tokens committed in the same step are drawn independently given the
tokens already there, so two of them may disagree with each other (a joint the model never
proposed); fewer tokens per step (more steps) make that rarer, and one token per step samples the
model's own sequential factorisation of the text.
"""

import dataclasses
import functools
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

RULES = ("ancestral", "confidence")
NEG_INF = -1e9


MIN_TEMPERATURE = 1e-3  # The smallest positive temperature (0 is argmax).


@dataclasses.dataclass(frozen=True)
class SamplerSettings:
  """How to sample (hashable: static in the jitted sampler); checked when built."""
  steps: int  # S: model calls.
  rule: str = "ancestral"  # One of RULES.
  block_size: int = 0  # Tokens per semi-autoregressive block; 0: one block (the whole canvas).
  temperature: float = 1.0  # Logits / temperature; 0: argmax.
  top_k: int = 0  # Keep the k most probable tokens; 0: all.
  top_p: float = 1.0  # Keep the smallest set of tokens with this much probability; 1: all.

  def __post_init__(self):
    if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
      raise ValueError(f"steps={self.steps!r}: it must be an integer >= 1")
    if self.rule not in RULES:
      raise ValueError(f"rule={self.rule!r}: use one of {RULES}")
    if not isinstance(self.block_size, int) or self.block_size < 0:
      raise ValueError(f"block_size={self.block_size!r}: it must be an integer >= 0 (0: one "
                       "block)")
    if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature < math.inf):
      raise ValueError(f"temperature={self.temperature!r}: it must be 0 (argmax) or a finite "
                       f"number >= {MIN_TEMPERATURE} (below it the draws are argmax's in f32)")
    if not isinstance(self.top_k, int) or self.top_k < 0:
      raise ValueError(f"top_k={self.top_k!r}: it must be an integer >= 0 (0: all tokens)")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p={self.top_p!r}: it must be in (0, 1]")


def step_plan(length: int, settings: SamplerSettings) -> dict[str, np.ndarray]:
  """The static plan of every step: its block [start, end), times t -> s and, for "confidence",
  how many tokens it commits. [S] arrays."""
  block = settings.block_size or length
  blocks = [(a, min(a + block, length)) for a in range(0, length, block)]
  if settings.steps < len(blocks):
    raise ValueError(f"steps={settings.steps} is fewer than the {len(blocks)} blocks of "
                     f"block_size {block} in a length of {length}: each block needs a step")
  plan = {name: [] for name in ("start", "end", "t", "s", "commit")}
  share, extra = divmod(settings.steps, len(blocks))
  for index, (start, end) in enumerate(blocks):
    n = share + (index < extra)
    base, rest = divmod(end - start, n)
    for k in range(n):
      plan["start"].append(start)
      plan["end"].append(end)
      plan["t"].append(1.0 - k / n)
      plan["s"].append(1.0 - (k + 1) / n)
      plan["commit"].append(base + (k < rest))
  return {"start": np.asarray(plan["start"], np.int32), "end": np.asarray(plan["end"], np.int32),
          "t": np.asarray(plan["t"], np.float32), "s": np.asarray(plan["s"], np.float32),
          "commit": np.asarray(plan["commit"], np.int32)}


def filter_logits(logits: jax.Array, settings: SamplerSettings) -> jax.Array:
  """[..., V] f32 logits / temperature with top-k and top-p applied (removed: NEG_INF)."""
  if settings.temperature > 0:  # Removed tokens stay removed at any temperature (1e9: -1).
    logits = jnp.where(logits <= NEG_INF, NEG_INF, logits / settings.temperature)
  if settings.top_k:
    kth = jax.lax.top_k(logits, min(settings.top_k, logits.shape[-1]))[0][..., -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  if settings.top_p < 1.0:
    ranked = -jnp.sort(-logits, axis=-1)  # [..., V] descending
    probs = jax.nn.softmax(ranked, axis=-1)
    above = jnp.cumsum(probs, axis=-1) - probs  # Probability of the tokens ranked higher.
    kept = jnp.sum(above < settings.top_p, axis=-1, keepdims=True)  # >= 1: the first stays.
    cutoff = jnp.take_along_axis(ranked, kept - 1, axis=-1)
    logits = jnp.where(logits < cutoff, NEG_INF, logits)
  return logits


def _draw(key: jax.Array, logits: jax.Array, settings: SamplerSettings
          ) -> tuple[jax.Array, jax.Array]:
  """[B, T, V] filtered logits -> (tokens [B, T], their probability under the filtered
  distribution [B, T])."""
  if settings.temperature > 0:
    tokens = jnp.argmax(logits + jax.random.gumbel(key, logits.shape, jnp.float32), axis=-1)
  else:
    tokens = jnp.argmax(logits, axis=-1)
  probs = jax.nn.softmax(logits, axis=-1)
  return tokens.astype(jnp.int32), jnp.take_along_axis(probs, tokens[..., None], -1)[..., 0]


def sample(logits_fn: Callable[[jax.Array], jax.Array], ids: jax.Array, start: int,
           length: int, key: jax.Array, settings: SamplerSettings, mask_id: int,
           never: tuple[int, ...], stop: int | None = None) -> jax.Array:
  """Fills the canvas, positions [start, start + length) of `ids` [B, T] (all [MASK] on entry);
  the rest (the prompt, the special tokens) is never changed. `logits_fn(ids [B, T]) ->
  [B, T, V]` is the model. Returns the ids with the canvas filled (after the first `stop`
  steps only, when given: the state midway). Jit-able (everything but `logits_fn`'s inputs,
  `ids` and `key` static)."""
  plan = {k: jnp.asarray(v) + (start if k in ("start", "end") else 0)
          for k, v in step_plan(length, settings).items()}
  position = jnp.arange(ids.shape[1], dtype=jnp.int32)  # [T]
  never = jnp.asarray(never, jnp.int32)

  def body(i, ids):
    draw_key, unmask_key = jax.random.split(jax.random.fold_in(key, i))
    in_block = (position >= plan["start"][i]) & (position < plan["end"][i])  # [T]
    masked = (ids == mask_id) & in_block[None, :]  # [B, T]
    logits = logits_fn(ids).astype(jnp.float32)  # [B, T, V]
    vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    logits = jnp.where(jnp.isin(vocab, never), NEG_INF, logits)
    tokens, confidence = _draw(draw_key, filter_logits(logits, settings), settings)  # [B, T]
    if settings.rule == "ancestral":
      t, s = plan["t"][i], plan["s"][i]
      chance = jnp.where(s <= 0.0, 1.0, (t - s) / t)
      commit = masked & (jax.random.uniform(unmask_key, masked.shape) < chance)
    else:
      score = jnp.where(masked, confidence, -1.0)  # [B, T]
      rank = jnp.argsort(jnp.argsort(-score, axis=-1), axis=-1)  # 0: the most confident.
      commit = masked & (rank < plan["commit"][i])
    return jnp.where(commit, tokens, ids)

  return jax.lax.fori_loop(0, settings.steps if stop is None else stop, body, ids)


@functools.partial(jax.jit, static_argnames=("apply", "start", "length", "settings", "mask_id",
                                             "never"))
def generate(params, ids: jax.Array, key: jax.Array, *, apply, start: int, length: int,
             settings: SamplerSettings, mask_id: int, never: tuple[int, ...]) -> jax.Array:
  """`sample` with the model `apply(params, ids [B, T]) -> [B, T, V]`, compiled once per
  (shape, canvas, settings)."""
  return sample(lambda x: apply(params, x), ids, start, length, key, settings, mask_id, never)

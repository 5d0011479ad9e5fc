"""Protocol-buffer base-128 varints, for the hand-written record and checkpoint formats
(`data/examples.py` writes tf.train.Example bytes, `tf_checkpoint.py` reads/writes TF bundles)."""


def encode_varint(value: int) -> bytes:
  """Unsigned varint; a negative int64 becomes its 10-byte two's-complement form, as protobuf."""
  value &= (1 << 64) - 1
  out = bytearray()
  while True:
    byte = value & 0x7F
    value >>= 7
    if value:
      out.append(byte | 0x80)
    else:
      out.append(byte)
      return bytes(out)

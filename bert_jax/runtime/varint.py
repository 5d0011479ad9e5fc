"""Protocol-buffer base-128 varints, for hand-written protobuf bytes: `data/records.py` writes
tf.train.Example records with them (as does the tests' TF-bundle writer, its index entries).
Readers decode varints themselves (`weights/tf_bundle.py`)."""


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

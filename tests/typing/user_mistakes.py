"""Mistakes a type checker must catch (tests/test_typing.py expects each one)."""

import dataclasses

import kiln


@dataclasses.dataclass
class Rec:
    id: int


kiln.encode(Rec(1), Rec, frame="yes")  # E: frame
kiln.decode(123, Rec)  # E: buffer
n: int = kiln.decode(b"", Rec)  # E: result
s: str = kiln.Decoder(Rec).decode(b"")  # E: decoder result
kiln.decode_tensors(b"").names.append(3)  # E: names
m: int = kiln.load_tensors("m.kiln")  # E: a name kiln imports on first use
k: int = kiln.open("m.kiln")["w"]  # E: a file maps names to Tensors
kiln.load("r.kiln", Rec).nope  # E: load is typed as the class given

"""Mutation fuzzing of the converters without atheris or a sanitizer build.

    python tools/fuzz_convert.py KIND SECONDS [SEED]     KIND: safetensors | gguf | npz

Mutates the seed corpus (fuzz/corpus/KIND: bit flips, byte sets, cuts,
insertions) and runs every input through the converter oracle
(fuzz/oracle.py check_convert_input).  Each new kind of failure is printed
and its input saved as /tmp/kiln-fuzz-convert-KIND-N; minimize one, fix the
converter, and add it to fuzz/corpus/KIND under a ``finding-`` name.
"""

import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "fuzz"))
import oracle  # noqa: E402


def mutate(rng, data):
    d = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op, at = rng.random(), rng.randrange(max(len(d), 1))
        if op < 0.4 and d:
            d[at] ^= 1 << rng.randrange(8)
        elif op < 0.6 and d:
            d[at] = rng.choice([0, 1, 2, 0x7F, 0x80, 0xFF])
        elif op < 0.8:
            del d[at:at + rng.randint(1, 32)]
        else:
            d[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(d)


def main():
    kind, secs = sys.argv[1], float(sys.argv[2])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    folder = os.path.join(ROOT, "fuzz", "corpus", kind)
    seeds = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            seeds.append(f.read())
    start, runs, seen = time.time(), 0, set()
    while time.time() - start < secs:
        data = mutate(rng, rng.choice(seeds))
        runs += 1
        try:
            oracle.check_convert_input(kind, data)
        except Exception as e:   # anything but the oracle's pass is a finding
            key = (type(e).__name__, str(e)[:80])
            if key not in seen:
                seen.add(key)
                path = "/tmp/kiln-fuzz-convert-%s-%d" % (kind, len(seen))
                with open(path, "wb") as f:
                    f.write(data)
                print("%s: %s: %s (%s)" % (kind, key[0], key[1], path), flush=True)
    print("%s: %d runs in %.0f s, %d findings" % (kind, runs, time.time() - start, len(seen)))


if __name__ == "__main__":
    main()

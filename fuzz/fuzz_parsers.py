"""atheris harness: JSON Schema text, type text and metadata blocks (byte 0
picks which; see parsers_oracle.py)."""
import harness  # noqa: F401  (loads libFuzzer globally, then kiln instrumented)
import atheris

with atheris.instrument_imports(include=["parsers_oracle"]):
    import parsers_oracle

if __name__ == "__main__":
    harness.main(parsers_oracle.check_parsers_input)

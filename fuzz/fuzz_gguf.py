"""atheris harness: gguf files through kiln convert (only KilnError may escape)."""
import harness

if __name__ == "__main__":
    harness.main(lambda data: harness.oracle.check_convert_input("gguf", data))

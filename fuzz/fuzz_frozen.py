"""atheris harness: Frozen values under a few fixed types (see oracle.FROZEN_TYPES)."""
import harness

if __name__ == "__main__":
    harness.main(harness.oracle.check_frozen_input)

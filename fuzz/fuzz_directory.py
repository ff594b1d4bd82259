"""atheris harness: tensor directories (views, copies, trusted, small caps)."""
import harness

if __name__ == "__main__":
    harness.main(harness.oracle.check_directory_input)

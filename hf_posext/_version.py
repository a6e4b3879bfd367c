"""The package version, in a leaf module so subpackages can read it without importing `hf_posext`."""

__version__ = "0.1.0"

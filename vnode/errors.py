"""The provider-facing error vocabulary."""

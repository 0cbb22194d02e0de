"""The package version: the version of the Sandhive API it is made for."""

__version__ = "0.1.0"

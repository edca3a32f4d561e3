"""The local web page of ``stockade ui``."""

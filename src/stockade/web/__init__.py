"""The local web page of ``stockade ui``. Must not import the engine."""

"""Reading and writing: model files (never pickle)."""

from dkmeans.io.model_file import FORMAT_VERSION, ModelFileError, load_model, save_model

__all__ = ["FORMAT_VERSION", "ModelFileError", "load_model", "save_model"]

"""faultwatch: detect errors and hangs in distributed training jobs from their log streams."""

__version__ = "0.1.0"

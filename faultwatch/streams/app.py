"""Kept for existing imports (bench): the Faust shell lives in faust_app."""

from faultwatch.streams.faust_app import Processor, ProcessorConfig, build_app, build_processor

__all__ = ["Processor", "ProcessorConfig", "build_app", "build_processor"]

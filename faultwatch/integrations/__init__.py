"""Optional framework callbacks that report progress and stages through the training SDK.

    from faultwatch.integrations.huggingface import FaultwatchCallback
    trainer = Trainer(..., callbacks=[FaultwatchCallback()])

    from faultwatch.integrations.lightning import FaultwatchCallback
    trainer = lightning.Trainer(..., callbacks=[FaultwatchCallback()])

Each module imports its framework; import only the one you use. Without an agent they do
nothing (the SDK is a silent no-op).
"""

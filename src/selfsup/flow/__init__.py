"""The generative wing's flow path and sampling: flow-matching diffusion transformers (plain flow matching,
Self-Flow, REPA), laid out as SiT's ``transport/`` beside its ``sample.py``.

Modules: ``path`` (linear path, t sampling), ``objective`` (losses, Self-Flow masking, heads; pure),
``sampler`` (Euler ODE, Euler–Maruyama SDE, guidance; a model sampled in batches), ``metrics`` (encoder
Fréchet distance, class fidelity, Inception FID). Sampling and judging a run folder is ``runs.generation`` (``selfsup
eval generation``; ``selfsup generate`` is ``commands.generate``).
The model is ``models/sit.py`` (SiT, and ``FlowEncoder``: a flow model as a feature extractor for
``selfsup eval``); the LightningModules are ``methods/flow.py`` (registered as ``flow_matching``,
``self_flow`` and ``repa``); a run folder is loaded by ``runs.source.load_flow_run``.

Interface for sampling and metrics (stable):

* ``model(x_t, t, y) -> velocity``: ``x_t`` (B, C, S, S) in the model's space, ``t`` of shape (B,) or
  per token (B, N) with t = 1 pure noise and t = 0 data, ``y`` (B,) long class indices where
  ``model.num_classes`` is the null class (classifier-free guidance; an unconditional model has
  ``num_classes == 0``). The velocity is ``ε − x_0`` of ``x_t = (1 − t)·x_0 + t·ε``, so an Euler step
  from t to t − Δ is ``x ← x − Δ·v``.
* ``selfsup.runs.source.load_flow_run(run_dir) -> (ema_model, cfg, info)``: the EMA SiT (eval mode,
  CPU, no grad), the run's ``RunConfig``, and ``info`` (dict): method, dataset, channels,
  image_size (the model's input size), data_size (the dataset's own), fit (resize | pad),
  num_classes, latents (bool), mean/std (pixel data: the model's space is ``(image − mean)/std``
  = ``2·image − 1`` for images in [0, 1]), weights (the file read). A non-flow run raises UserError.
"""

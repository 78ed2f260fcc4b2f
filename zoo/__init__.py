"""The SmolLM2-135M miniature: the shipped drafters (weights, config, card, verify report) and the
code around them -- the training prompts (``prompts``), the loadable folders (``shipped``),
``mfd-hub demo`` (``demo``), ``mfd-hub bench`` (``bench``) and shipping (``ship``)."""

"""vramscope ground-truth harness: measures real PyTorch training memory on a GPU.

Pure modules (no torch needed): knobs, grid, models, plan, schema, env, driver,
summary. loop needs torch; worker needs torch + transformers (+ peft,
bitsandbytes), imported lazily inside its functions.
"""

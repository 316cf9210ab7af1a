"""GPT-2 itself: the numpy oracle (`gpt2`), checkpoints (`weights`, `weights_choice`, `synth`), the tokenizer.

The lowest layer: nothing here imports grading, processes, reports or the CLI.
"""

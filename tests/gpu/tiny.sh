# The qwen3-tiny run that the GPU's losses are compared with (sourced by bundle.sh and run.sh): the model and
# synthetic data of tests/mpi/common.sh with equivalence.sh's 20 steps, GA 2 and learning rate.
tiny=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=128
  base_num_decoder_layers=2 vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path=
  dataset_path= eval_dataset_path= eval_interval=0 checkpoint_period=0 steps=20 gradient_accumulation_steps=2
  learning_rate=1e-2 per_device_batch_size=4)
# deepseek-custom-tiny (MLA, a dense first layer, then MoE layers: 8 routed experts, top-2 sigmoid scores with
# the selection bias and its update, one shared expert) for 20 steps on synthetic data, with Engram and mHC
# turned off (engram_layers=[] mhc_expansion_rate=1): their cuda kernels are not in this build yet.
deepseek=(engram_layers=[] mhc_expansion_rate=1 dataset_type=synthetic tokenizer_path= dataset_path=
  eval_dataset_path= eval_interval=0 checkpoint_period=0 steps=20 per_device_batch_size=4 max_target_length=64)

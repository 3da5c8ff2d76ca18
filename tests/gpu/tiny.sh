# The qwen3-tiny run that the GPU's losses are compared with (sourced by bundle.sh and run.sh): the model and
# synthetic data of tests/mpi/common.sh with equivalence.sh's 20 steps, GA 2 and learning rate.
tiny=(base_emb_dim=64 base_num_query_heads=4 base_num_kv_heads=2 head_dim=16 base_mlp_dim=128
  base_num_decoder_layers=2 vocab_size=256 max_target_length=32 dataset_type=synthetic tokenizer_path=
  dataset_path= eval_dataset_path= eval_interval=0 checkpoint_period=0 steps=20 gradient_accumulation_steps=2
  learning_rate=1e-2 per_device_batch_size=4)
# The same model with Engram on both layers and mHC with 2 residual streams (DeepSeek's block, which carries
# them, here with global attention and dense MLPs): the GPU run of those layers' kernels.
engram_mhc=(decoder_block=deepseek engram_layers=[0,1] engram_num_heads=2 engram_head_dim=8
  engram_vocab_bases=[61,67] engram_kernel_size=3 mhc_expansion_rate=2)
# deepseek-custom-tiny (MLA, a dense first layer, then MoE layers: 8 routed experts, top-2 sigmoid scores with
# the selection bias and its update, one shared expert; the preset's Engram and mHC) for 20 steps on synthetic
# data.
deepseek=(dataset_type=synthetic tokenizer_path= dataset_path=
  eval_dataset_path= eval_interval=0 checkpoint_period=0 steps=20 per_device_batch_size=4 max_target_length=64)

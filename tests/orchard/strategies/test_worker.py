"""orchard/strategies/worker.py on its own, in one process: a worker's share of the data, the
environment of a loop outside Ray Train, and the two replicas a training loop steps through
(ring's local optimizer; ps's servers, real actors on the session's Ray) matching plain torch,
with a ps checkpoint that survives ``torch.save``/``torch.load(weights_only=True)`` and restores
the servers. Under Ray Train with several workers (and a worker that dies): test_launch.py."""
import io

import pytest
import torch

from orchard.strategies import worker

OPT = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
X = torch.linspace(-1, 1, 24).reshape(6, 4)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


def train(rep, steps: int = 3) -> None:
    for _ in range(steps):
        rep.zero_grad()
        ((rep.model(X) - Y) ** 2).mean().backward()
        rep.step()


def plain_torch(steps: int = 3) -> list[torch.Tensor]:
    """The same steps with torch's own SGD: what either replica must reproduce on one worker."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=OPT["lr"], momentum=OPT["momentum"])
    for _ in range(steps):
        opt.zero_grad()
        ((net(X) - Y) ** 2).mean().backward()
        opt.step()
    return [p.detach() for p in net.parameters()]


@pytest.fixture
def ps_group(ray_session):
    from orchard.strategies.ps import PSGroup

    made = []

    def _group(num_servers: int = 2):
        made.append(PSGroup.create(num_servers=num_servers, num_workers=1, mode="sync", optimizer=OPT))
        return made[-1]

    yield _group
    for group in made:
        group.shutdown()


def test_each_worker_takes_an_equal_share_and_the_tail_is_dropped():
    items = list(range(10))
    shares = [worker.WorkerEnv(rank, 3, rank, torch.device("cpu")).shard(items) for rank in range(3)]
    assert shares == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]   # item 9 would give one worker an extra step


def test_outside_ray_train_a_loop_is_the_only_worker_on_this_machines_device():
    env = worker.env({"strategy": {"name": "ring"}})
    assert (env.rank, env.world_size, env.local_rank) == (0, 1, 0)
    assert env.device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_ring_replica_on_one_worker_steps_as_its_torch_optimizer_does():
    rep = worker.replica(model(), OPT, {"strategy": {"name": "ring"}})
    assert isinstance(rep, worker.RingReplica) and rep.model is rep.module   # no DDP wrapper for one worker
    train(rep)
    for got, want in zip(rep.module.parameters(), plain_torch()):
        assert torch.allclose(got, want, atol=1e-6)
    rep.zero_grad()
    assert all(p.grad is None for p in rep.module.parameters()) and rep.comm_stats() == {}


def test_the_ring_hook_times_ddps_own_all_reduce_and_counts_its_gradients(tmp_path):
    """The DDP communication hook a ring replica registers with more than one worker, on a real
    gloo group of one process: DDP's all-reduce still averages (the same weights as without the
    hook), every step's last bucket is timed, every gradient byte counted."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model())
        timer = worker.AllReduceTimer(1)
        ddp.register_comm_hook(timer, worker.timed_allreduce)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(X), Y).backward()
            opt.step()
        assert timer.steps == 3 and timer.wait_s > 0 and timer.grad_bytes == 3 * 5 * 4  # 5 float32 a step
        for got, want in zip(ddp.module.parameters(), plain_torch(steps=3)):
            assert torch.allclose(got, want, atol=1e-6)
    finally:
        dist.destroy_process_group()
    two = worker.AllReduceTimer(2)
    two.grad_bytes, two.steps = 4000, 2
    assert two.bytes_per_step() == 2 * 2000  # a ring of 2: the gradients once each way


def test_a_ps_replica_on_one_worker_steps_as_torch_does_and_counts_its_traffic(ps_group):
    rep = worker.replica(model(), OPT, {"strategy": {"name": "ps"}, "ps_group": ps_group(num_servers=1)})
    assert isinstance(rep, worker.PSReplica)
    train(rep)
    for got, want in zip(rep.module.parameters(), plain_torch()):
        assert torch.allclose(got, want, atol=1e-5)
    param_bytes = sum(p.numel() * 4 for p in rep.module.parameters())
    stats = rep.comm_stats()
    assert stats["wire/bytes_per_step"] == 2 * param_bytes and "time/comm_wait_s" in stats   # gradients up, weights down


@pytest.mark.slow
def test_a_ps_checkpoint_saved_with_torch_restores_the_weights_the_servers_and_the_step_count(ps_group):
    first = worker.replica(model(), OPT, {"strategy": {"name": "ps"}, "ps_group": ps_group()})
    train(first, steps=2)
    buf = io.BytesIO()
    torch.save({"state": first.state_dict(), "epoch": 0}, buf)   # as save_checkpoint writes it
    buf.seek(0)
    state = torch.load(buf, weights_only=True)["state"]          # as load_checkpoint reads it

    torch.manual_seed(1)   # another start: other weights, fresh servers
    again = worker.replica(torch.nn.Linear(4, 1), OPT, {"strategy": {"name": "ps"}, "ps_group": ps_group()})
    again.load_state_dict(state)
    assert again.steps == 2
    train(again, steps=1)   # the momentum came back with the servers: step 3 as if never stopped
    for got, want in zip(again.module.parameters(), plain_torch(steps=3)):
        assert torch.allclose(got, want, atol=1e-5)

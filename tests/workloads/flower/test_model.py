"""The CNN layer by layer against the thesis's Table 3.1 / 3.2, and its loss."""
import pytest
import torch

from workloads.flower.model import count_parameters, euclidean_loss, FlowerCounterCNN

# Table 3.1 as printed: TensorFlow shapes, conv (kh, kw, in, out), deconv (kh, kw, out, in).
TABLE_3_1 = {
    0: {"conv1": (9, 9, 3, 16), "conv2": (7, 7, 16, 32), "conv3": (7, 7, 32, 16), "conv4": (7, 7, 16, 8),
        "deconv1": (7, 7, 8, 8), "deconv2": (7, 7, 16, 8)},
    1: {"conv1": (7, 7, 3, 20), "conv2": (5, 5, 20, 40), "conv3": (5, 5, 40, 20), "conv4": (5, 5, 20, 10),
        "deconv1": (5, 5, 10, 10), "deconv2": (5, 5, 20, 10)},
    2: {"conv1": (5, 5, 3, 24), "conv2": (3, 3, 24, 48), "conv3": (3, 3, 48, 24), "conv4": (3, 3, 24, 12),
        "deconv1": (3, 3, 12, 12), "deconv2": (3, 3, 24, 12)},
}
# Table 3.1's byte column (float32) for the kernels, per column.
TABLE_3_1_KERNEL_BYTES = {0: [15552, 100352, 100352, 25088, 12544, 25088],
                          1: [11760, 80000, 80000, 20000, 10000, 20000],
                          2: [7200, 41472, 41472, 10368, 5184, 10368]}


def torch_shape(layer: str, tf_shape):
    kh, kw, a, b = tf_shape
    # conv: TF (kh, kw, in, out) -> torch (out, in, kh, kw); deconv: TF (kh, kw, out, in) -> torch (in, out, kh, kw)
    return (b, a, kh, kw)


@pytest.mark.parametrize("column", [0, 1, 2])
def test_every_parameter_shape_matches_table_3_1(column):
    model = FlowerCounterCNN()
    params = dict(model.named_parameters())
    for i, (layer, tf_shape) in enumerate(TABLE_3_1[column].items()):
        weight = params[f"columns.{column}.{layer}.weight"]
        assert tuple(weight.shape) == torch_shape(layer, tf_shape), layer
        assert weight.numel() * 4 == TABLE_3_1_KERNEL_BYTES[column][i], layer
        out_maps = tf_shape[3] if layer.startswith("conv") else tf_shape[2]
        assert tuple(params[f"columns.{column}.{layer}.bias"].shape) == (out_maps,), layer


def test_final_layer_matches_table_3_2_and_nothing_else_exists():
    model = FlowerCounterCNN()
    params = dict(model.named_parameters())
    assert tuple(params["final_conv.weight"].shape) == (1, 60, 1, 1)  # 1x1x60x1, 240 bytes
    assert params["final_conv.weight"].numel() * 4 == 240
    assert params["final_conv.bias"].numel() * 4 == 4
    assert len(params) == 3 * 6 * 2 + 2
    table_total = sum(v for col in TABLE_3_1_KERNEL_BYTES.values() for v in col) // 4
    biases = sum(p.numel() for n, p in params.items() if n.endswith("bias"))
    assert count_parameters(model) == table_total + biases + 60


@pytest.mark.parametrize("size", [(32, 32), (64, 96), (224, 224)])
def test_density_map_comes_out_at_input_resolution(size):
    model = FlowerCounterCNN().eval()
    with torch.no_grad():
        out = model(torch.rand(2, 3, *size))
    assert out.shape == (2, 1, *size)


def test_euclidean_loss_is_the_mean_per_image_l2_distance():
    target = torch.zeros(2, 1, 4, 4)
    predicted = torch.zeros(2, 1, 4, 4)
    predicted[0, 0, 0, :] = 1.0  # distance 2
    predicted[1, 0, :, :] = 1.0  # distance 4
    assert euclidean_loss(predicted, target).item() == pytest.approx(3.0, rel=1e-6)


def test_a_few_steps_learn_to_put_density_where_the_yellow_is():
    torch.manual_seed(0)
    model = FlowerCounterCNN()
    x = torch.zeros(4, 3, 32, 32)
    y = torch.zeros(4, 1, 32, 32)
    for i, (r, c) in enumerate([(4, 4), (10, 20), (22, 8), (20, 24)]):
        x[i, :2, r:r + 4, c:c + 4] = 1.0  # a yellow square ...
        y[i, 0, r:r + 4, c:c + 4] = 1.0   # ... is where the density is
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = euclidean_loss(model(x), y)
        losses.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert min(losses[-5:]) < 0.6 * losses[0]

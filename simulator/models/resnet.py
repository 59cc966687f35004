"""ResNet-50 v1.5 training steps from the published architecture.

Architecture: He et al., "Deep Residual Learning for Image Recognition" (CVPR 2016), Table 1
(50-layer: bottleneck stages of 3, 4, 6, 3 blocks, widths 64, 128, 256, 512, expansion 4),
with the v1.5 change of NVIDIA's DeepLearningExamples (the stride-2 convolution of a
down-sampling block is the 3x3 one, not the first 1x1). Input 224 x 224 x 3 (ImageNet),
1000 classes. Mixed precision: fp16 activations and convolutions, fp32 weights, gradients
all-reduced in fp32, SGD with momentum.
"""

from __future__ import annotations

import itertools

from ..runtime import NPU, Tensor

#: (blocks, bottleneck width, first stride) of the four stages.
RESNET50_STAGES = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))
RESNET50_EXPANSION = 4
IMAGE_HW = 224
NUM_CLASSES = 1000
#: Gradient buckets all-reduced per step (MindSpore's ResNet-50 recipe fuses the gradients
#: into three AllReduce calls: all_reduce_fusion_config [85, 160] over its 161 parameters).
ALLREDUCE_BUCKET_SPLITS = (85 / 161, 160 / 161)


def _conv_shapes(batch: int) -> list[tuple[tuple[int, int, int, int], tuple[int, int, int, int], int, int, str]]:
    """Every convolution as (x shape, weight shape, stride, padding, role), in forward order.

    ``role`` is ``stem``, ``a``/``b``/``c`` (the three convolutions of a bottleneck) or
    ``down`` (the projection shortcut).
    """
    convs = []
    hw = IMAGE_HW
    convs.append(((batch, 3, hw, hw), (64, 3, 7, 7), 2, 3, "stem"))
    hw = hw // 2 // 2  # stem stride 2, then the 3x3 stride-2 max pool
    cin = 64
    for blocks, width, first_stride in RESNET50_STAGES:
        cout = width * RESNET50_EXPANSION
        for i in range(blocks):
            stride = first_stride if i == 0 else 1
            convs.append(((batch, cin, hw, hw), (width, cin, 1, 1), 1, 0, "a"))
            convs.append(((batch, width, hw, hw), (width, width, 3, 3), stride, 1, "b"))
            out_hw = hw // stride
            convs.append(((batch, width, out_hw, out_hw), (cout, width, 1, 1), 1, 0, "c"))
            if i == 0:
                convs.append(((batch, cin, hw, hw), (cout, cin, 1, 1), stride, 0, "down"))
            cin, hw = cout, out_hw
    return convs


def resnet50_param_count() -> int:
    """Weights of ResNet-50: convolutions, batch-norm scale and shift, and the classifier."""
    convs = _conv_shapes(1)
    conv = sum(co * ci * kh * kw for _, (co, ci, kh, kw), _, _, _ in convs)
    bn = sum(2 * co for _, (co, _, _, _), _, _, _ in convs)
    fc = 2048 * NUM_CLASSES + NUM_CLASSES
    return conv + bn + fc


def resnet50_training_step(npu: NPU, *, batch_size: int = 256, dtype: str = "fp16", fusion: bool = True) -> None:
    """One data-parallel training step of ResNet-50 v1.5 with ``batch_size`` images per card.

    Forward: each convolution with its batch norm and ReLU; the residual Add before the last
    ReLU of each block. Backward in reverse order (ReLU, batch-norm and both convolution
    gradients; the stem needs no input gradient). Then the gradient AllReduce over all cards
    in three buckets, and the momentum update. With ``fusion`` (graph mode, as MindSpore
    runs it), batch norm and ReLU are one pass each way (``BatchNormRelu``); without, they
    are separate kernels as in eager mode.

    Raises:
        ShapeError: ``batch_size`` is not a positive integer.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        from ..runtime import ShapeError

        raise ShapeError(f"resnet50: batch_size must be a positive integer, got {batch_size!r}")
    convs = _conv_shapes(batch_size)
    saved: list[tuple[Tensor, Tensor, Tensor, int, int, str]] = []
    x = npu.tensor((batch_size, 3, IMAGE_HW, IMAGE_HW), dtype)
    for x_shape, w_shape, stride, padding, role in convs:
        inp = npu.tensor(x_shape, dtype)
        weight = npu.tensor(w_shape, dtype)
        y = npu.conv2d(inp, weight, stride=stride, padding=padding)
        if fusion:
            if role == "c":  # the residual joins before the block's last ReLU
                y = npu.batch_norm_add_relu(y, npu.tensor(y.shape, dtype))
            elif role == "down":
                y = npu.batch_norm_update(y)
            else:
                y = npu.batch_norm_relu(y)
        elif role == "c":
            y = npu.relu(npu.add(npu.batch_norm(y), npu.tensor(y.shape, dtype)))
        elif role == "down":
            y = npu.batch_norm(y)
        else:
            y = npu.relu(npu.batch_norm(y))
        if role == "stem":
            y = npu.max_pool(y)
        saved.append((inp, weight, y, stride, padding, role))
        x = y
    pooled = npu.global_avg_pool(x)
    logits = npu.matmul(pooled, npu.tensor((2048, NUM_CLASSES), dtype))
    npu.cross_entropy(logits)

    dlogits = npu.cross_entropy_grad(logits)
    npu.matmul(dlogits, npu.tensor((2048, NUM_CLASSES), dtype), transpose_b=True)  # d pooled
    npu.matmul(pooled, dlogits, transpose_a=True)  # d fc weight
    npu.global_avg_pool_grad(npu.tensor(pooled.shape, dtype), x)
    for inp, weight, y, stride, padding, role in reversed(saved):
        dy = npu.tensor(y.shape, dtype)
        if role == "stem":
            dy = npu.max_pool_grad(dy, npu.tensor((batch_size, 64, IMAGE_HW // 2, IMAGE_HW // 2), dtype))
        conv_out = npu.tensor((inp.shape[0], weight.shape[0], *dy.shape[2:]), dtype)
        if role == "down":
            conv_out_grad = npu.batch_norm_grad(conv_out, conv_out)
        elif fusion:
            conv_out_grad = npu.batch_norm_relu_grad(conv_out, conv_out)
        else:
            conv_out_grad = npu.batch_norm_grad(npu.relu_grad(conv_out, conv_out), conv_out)
        dx = npu.conv2d_backward(conv_out_grad, inp, weight, stride=stride, padding=padding,
                                 input_grad=role != "stem")
        if role == "a" and not fusion:
            # The block input's gradient sums the main path and the shortcut; graph mode
            # folds this Add into the convolution gradient (Conv2DBackpropEltwiseFusionPass).
            npu.add(dx, npu.tensor(dx.shape, dtype))

    params = resnet50_param_count()
    if npu.devices > 1:
        edges = [0, *(round(params * f) for f in ALLREDUCE_BUCKET_SPLITS), params]
        for lo, hi in itertools.pairwise(edges):
            npu.all_reduce(npu.tensor((hi - lo,), "fp32"))
    npu.momentum(params)

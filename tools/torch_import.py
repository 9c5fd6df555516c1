#!/usr/bin/env python3
"""PyTorch models in: traces an nn.Module with torch.fx and writes a pipegrid model file.

    pipegrid import (--torchvision NAME | --file MODEL.py --class NAME [--kwargs JSON])
                    --input-shape 3,224,224 [--input-dtype auto|float|long] [-o model.yaml]
                    [--report FILE] [--profile PROFILE.yaml --batch B --repeat N]

(`pipegrid import` runs this script; it can also be run directly.) Documented in
docs/import-export.md.

What it does:
  1. Builds the module (a torchvision model by name, or CLASS(**kwargs) from a Python file) and
     traces it with torch.fx (torch.nn's standard layers, nn.TransformerEncoderLayer,
     nn.MultiheadAttention and nn.LSTM are leaves), then propagates shapes with a batch of 2.
  2. Maps every traced operation to a layer of pipegrid's model file (workloads/README.md): the
     DAG is kept (a layer lists `inputs` whenever its input is not the previous layer). Fusions,
     the same ones the zoo makes (core/models/zoo.cc): Conv2d -> BatchNorm2d -> ReLU become one
     conv2d layer (batchnorm: true, relu: true) when each is the previous one's only user.
     Views (reshape, permute, transpose, contiguous, Identity, eval-time no-ops) are aliases,
     except a flatten to one dimension per sample, which is a `flatten` layer. A Linear or an
     Embedding whose weight is an earlier Linear's or Embedding's (tied, e.g. a language-model
     head) gets `tied_to` that layer: parameters are counted once, and a stage without the source
     keeps a copy. Tied to another module's weight: a custom layer with the linear's FLOPs and no
     parameters.
  3. An operation it does not know becomes a `custom` layer with what its shapes give (bytes read
     and written, its module's parameters, its output shape; FLOPs for other convolutions and
     matrix products, none otherwise), listed in the report: never dropped.
  4. With --profile: times each layer's forward and backward on this machine (CPU, or CUDA when
     available and --device cuda) by re-running that layer's traced operations on its recorded
     inputs (median of --repeat runs after one warm-up) and writes a measured profile: the same
     DAG as custom layers with measured `forward` / `backward` times for `batch` samples, the
     parameters and output shapes, and a header naming the device, precision and batch.
"""
import argparse
import contextlib
import importlib.util
import io
import json
import math
import operator
import os
import platform
import statistics
import sys
import time


def fail(message, status=2):
    print(f"pipegrid import: {message}", file=sys.stderr)
    sys.exit(status)


try:
    import torch
    import torch.fx
    from torch import nn
    from torch.fx.passes.shape_prop import ShapeProp
except ImportError:  # pragma: no cover - depends on the machine
    fail("needs PyTorch (Debian: sudo apt-get install python3-torch python3-torchvision; "
         "or `tools/setup --all`)")

# Modules traced as one operation (not traced through).
LEAVES = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.MultiheadAttention, nn.LSTM,
          nn.GRU, nn.RNN)

ELEMENTWISE_MODULES = {nn.ReLU: "relu", nn.ReLU6: "relu", nn.GELU: "gelu", nn.Dropout: "dropout",
                       nn.Dropout2d: "dropout", nn.SiLU: "elementwise", nn.Sigmoid: "elementwise",
                       nn.Tanh: "elementwise", nn.Hardswish: "elementwise", nn.Hardsigmoid: "elementwise",
                       nn.LeakyReLU: "elementwise", nn.Softmax: "elementwise", nn.LogSoftmax: "elementwise"}
ELEMENTWISE_FUNCTIONS = {torch.relu: "relu", torch.nn.functional.relu: "relu", torch.nn.functional.gelu: "gelu",
                         torch.nn.functional.dropout: "dropout", torch.sigmoid: "elementwise",
                         torch.tanh: "elementwise", torch.nn.functional.silu: "elementwise",
                         torch.softmax: "elementwise", torch.nn.functional.softmax: "elementwise",
                         operator.mul: "elementwise", torch.mul: "elementwise", operator.truediv: "elementwise",
                         operator.sub: "elementwise", torch.nn.functional.hardswish: "elementwise"}
ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}
ALIAS_METHODS = {"view", "reshape", "permute", "transpose", "contiguous", "flatten", "squeeze", "unsqueeze",
                 "expand", "clone", "float", "to", "type_as", "detach"}
ALIAS_FUNCTIONS = {torch.flatten, torch.reshape, torch.permute, torch.transpose, torch.squeeze, torch.unsqueeze}
CONCAT_FUNCTIONS = {torch.cat, torch.concat} if hasattr(torch, "concat") else {torch.cat}


class Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m, qualname):
        return isinstance(m, LEAVES) or super().is_leaf_module(m, qualname)


def constructor_kwargs(text):
    """--kwargs: a JSON object."""
    if not text:
        return {}
    try:
        kwargs = json.loads(text)
    except ValueError as e:
        fail(f"--kwargs: expected a JSON object like '{{\"layers\": 4}}', got '{text}' ({e})")
    if not isinstance(kwargs, dict):
        fail(f"--kwargs: expected a JSON object like '{{\"layers\": 4}}', got '{text}' (a {type(kwargs).__name__})")
    return kwargs


def one_line(e):
    """An exception as one line: its type and the first line of its message (the innermost cause)."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0] if lines else ''}"


def load_module(args):
    kwargs = constructor_kwargs(args.kwargs)
    if args.torchvision:
        try:
            import torchvision.models as tvm
        except ImportError:
            fail("--torchvision needs torchvision (Debian: sudo apt-get install python3-torchvision)")
        builder = getattr(tvm, args.torchvision, None)
        if builder is None or not callable(builder) or args.torchvision.startswith("_"):
            names = sorted(n for n in dir(tvm) if n[:1].islower() and callable(getattr(tvm, n)) and not n.startswith("get"))
            fail(f"--torchvision: no model \"{args.torchvision}\" in torchvision.models (e.g. {', '.join(names[:12])}, ...)")
        try:
            return builder(**kwargs), args.torchvision
        except Exception as e:  # the constructor's own check of its arguments
            fail(f"--torchvision {args.torchvision}: {args.torchvision}(**{kwargs}): {one_line(e)}")
    if not os.path.isfile(args.file):
        fail(f"--file: cannot read \"{args.file}\"")
    spec = importlib.util.spec_from_file_location("pipegrid_user_model", args.file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # the user's file: report its error, do not crash
        fail(f"{args.file}: {one_line(e)}")
    cls = getattr(module, args.cls or "", None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, nn.Module)]
        fail(f"{args.file}: no class \"{args.cls}\" (nn.Module classes there: {', '.join(classes) or 'none'})")
    try:
        return cls(**kwargs), args.cls
    except Exception as e:
        fail(f"{args.file}: {args.cls}(**{kwargs}): {one_line(e)}")


def example_input(model, graph_module, shape, dtype, batch):
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        fail(f"the model's forward takes {len(placeholders)} inputs; one input tensor is supported")
    if dtype == "auto":
        dtype = "float"
        for user in placeholders[0].users:
            if user.op == "call_module" and isinstance(graph_module.get_submodule(user.target), (nn.Embedding, nn.EmbeddingBag)):
                dtype = "long"
    if dtype == "long":
        high = 2
        for m in model.modules():
            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
                high = m.num_embeddings
                break
        return torch.randint(0, high, (batch, *shape)), dtype
    return torch.randn(batch, *shape), dtype


def shape_of(node):
    meta = node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return None
    return list(meta.shape)[1:]  # per sample


def numel(shape):
    return math.prod(shape) if shape else 1


def yaml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


class Importer:
    def __init__(self, model, gm, precision_bytes=4):
        self.model = model
        self.gm = gm
        self.bytes = precision_bytes
        self.layers = []          # dicts: name, kind, keys..., inputs (layer names), nodes (fx nodes)
        self.value = {}           # fx node -> ("layer", name) | ("param", numel) | ("const", None)
        self.fused = set()        # fx nodes folded into an earlier layer
        self.custom = []          # (layer name, why)
        self.notes = []
        self.names = set()
        self.counted = set()      # id() of parameters already counted
        self.owner = {}           # id() of a Linear's or an Embedding's weight -> its layer's name
        self.params_by_module = {}

    # --- helpers ---------------------------------------------------------------------------
    def unique(self, name):
        base, i = name.replace("/", "."), 1
        while name in self.names:
            name = f"{base}_{i}"
            i += 1
        self.names.add(name)
        return name

    def tensor_inputs(self, node):
        out = []
        for a in node.all_input_nodes:
            v = self.value.get(a)
            if v and v[0] == "layer" and v[1] not in out:
                out.append(v[1])
        return out

    def module_parameters(self, module):
        """Parameters of `module` not counted yet (tied weights count once)."""
        n = 0
        for p in module.parameters():
            if id(p) not in self.counted:
                self.counted.add(id(p))
                n += p.numel()
        return n

    def add(self, node, kind, keys=None, inputs=None, nodes=None, name=None):
        if name is None:
            name = node.target if node.op == "call_module" and node.target not in self.names else node.name
        name = self.unique(str(name))
        last = (nodes or [node])[-1]
        out = shape_of(last)
        if out is None:  # a module returning a tuple (LSTM, MultiheadAttention): its first element
            firsts = [u for u in last.users if u.op == "call_function" and u.target is operator.getitem
                      and u.args[1] == 0]
            out = shape_of(firsts[0]) if firsts else None
        layer = {"name": name, "kind": kind, **(keys or {}),
                 "inputs": inputs if inputs is not None else self.tensor_inputs(node),
                 "_nodes": nodes or [node], "_out": out}
        self.layers.append(layer)
        for n in layer["_nodes"]:
            self.value[n] = ("layer", name)
        return layer

    def custom_layer(self, node, why, extra_params=0, module=None, flops=0.0):
        out = shape_of(node)
        if out is None:
            fail(f"operation {node.name} ({node.target}) returns no tensor shape; cannot import it")
        ins = [a for a in node.all_input_nodes if shape_of(a) is not None]
        read = sum(numel(shape_of(a)) for a in ins)
        params = (self.module_parameters(module) if module is not None else 0) + extra_params
        keys = {"output_shape": out,
                "forward_bytes": f"{(read + numel(out)) * self.bytes}B",
                "backward_bytes": f"{2 * (read + numel(out)) * self.bytes}B",
                "stash": f"{numel(out) * self.bytes}B"}
        if flops:
            keys["forward_flops"] = f"{flops:.17g}FLOP"
            keys["backward_flops"] = f"{2 * flops:.17g}FLOP"
            keys["backward_weight_flops"] = f"{flops:.17g}FLOP"
        if params:
            keys["parameters"] = params
        layer = self.add(node, "custom", keys)
        if why:
            self.custom.append((layer["name"], why))
        return layer

    def sole_user(self, node, types=None, functions=None):
        users = list(node.users)
        if len(users) != 1:
            return None
        u = users[0]
        if types and u.op == "call_module" and isinstance(self.gm.get_submodule(u.target), types):
            return u
        if functions and u.op == "call_function" and u.target in functions:
            return u
        return None

    def alias(self, node):
        src = node.all_input_nodes[0] if node.all_input_nodes else None
        if src is not None and src in self.value:
            self.value[node] = self.value[src]
        else:
            self.value[node] = ("const", None)

    # --- the walk ---------------------------------------------------------------------------
    def run(self):
        for node in self.gm.graph.nodes:
            if node in self.fused:
                continue
            if node.op == "placeholder":
                self.add(node, "input", {"shape": shape_of(node)}, inputs=[], name=node.name)
            elif node.op == "get_attr":
                attr = self.gm
                for part in node.target.split("."):
                    attr = getattr(attr, part)
                if isinstance(attr, nn.Parameter) and id(attr) not in self.counted:
                    self.counted.add(id(attr))
                    self.value[node] = ("param", attr.numel())
                else:
                    self.value[node] = ("const", None)
            elif node.op == "call_module":
                self.module(node, self.gm.get_submodule(node.target))
            elif node.op in ("call_function", "call_method"):
                self.function(node)
            elif node.op == "output":
                pass

    def module(self, node, m):
        if isinstance(m, nn.Conv2d) and self.plain_conv(m):
            keys = {"in_channels": m.in_channels, "out_channels": m.out_channels, "kernel": m.kernel_size[0],
                    "stride": m.stride[0], "padding": m.padding[0], "groups": m.groups,
                    "bias": m.bias is not None}
            nodes, params_from = [node], [m]
            bn = self.sole_user(node, types=(nn.BatchNorm2d,))
            if bn is not None:
                keys["batchnorm"] = True
                nodes.append(bn)
                params_from.append(self.gm.get_submodule(bn.target))
                relu = self.sole_user(bn, types=(nn.ReLU,), functions={torch.relu, torch.nn.functional.relu})
                if relu is not None:
                    keys["relu"] = True
                    nodes.append(relu)
            else:
                relu = self.sole_user(node, types=(nn.ReLU,), functions={torch.relu, torch.nn.functional.relu})
                if relu is not None:
                    keys["relu"] = True
                    nodes.append(relu)
            for n in nodes[1:]:
                self.fused.add(n)
            for pm in params_from:
                self.module_parameters(pm)
            self.add(node, "conv2d", keys, nodes=nodes)
        elif isinstance(m, nn.Linear):
            source = self.owner.get(id(m.weight))
            if source is not None and (m.bias is None or id(m.bias) not in self.counted):
                # tied to an earlier layer's weight (a language-model head): a linear with tied_to,
                # its bias its own; a copy where the source is on other devices (pipegrid's tied_to)
                if m.bias is not None:
                    self.module_parameters(m)
                self.add(node, "linear", {"in_features": m.in_features, "out_features": m.out_features,
                                          "bias": m.bias is not None, "tied_to": source})
                self.notes.append(f"{self.layers[-1]['name']}: a Linear with tied weights: tied_to {source}")
            elif any(id(p) in self.counted for p in m.parameters()):
                rows = numel(shape_of(node)[:-1]) if shape_of(node) else 1
                flops = 2.0 * m.in_features * m.out_features * rows
                self.custom_layer(node, None, module=m, flops=flops)
                self.notes.append(f"{self.layers[-1]['name']}: a Linear with tied weights: custom layer with "
                                  f"its FLOPs, parameters counted once")
            else:
                self.module_parameters(m)
                self.add(node, "linear", {"in_features": m.in_features, "out_features": m.out_features,
                                          "bias": m.bias is not None})
                self.owner[id(m.weight)] = self.layers[-1]["name"]
        elif isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)) and self.plain_pool(m):
            k = m.kernel_size if isinstance(m.kernel_size, int) else m.kernel_size[0]
            s = m.stride if isinstance(m.stride, int) else m.stride[0]
            p = m.padding if isinstance(m.padding, int) else m.padding[0]
            self.add(node, "maxpool" if isinstance(m, nn.MaxPool2d) else "avgpool",
                     {"kernel": k, "stride": s, "padding": p})
        elif isinstance(m, nn.AdaptiveAvgPool2d):
            out = m.output_size if isinstance(m.output_size, (tuple, list)) else (m.output_size, m.output_size)
            if None in out:
                self.custom_layer(node, "AdaptiveAvgPool2d with a None output size", module=m)
            else:
                self.add(node, "adaptive_avgpool", {"output": list(out)})
        elif isinstance(m, nn.BatchNorm2d):
            self.module_parameters(m)
            self.add(node, "batchnorm")
        elif isinstance(m, nn.LayerNorm):
            if self.module_parameters(m) not in (0, 2 * shape_of(node)[-1]):
                self.notes.append(f"{node.name}: LayerNorm over more than the last dimension")
            self.add(node, "layernorm")
        elif type(m) in ELEMENTWISE_MODULES:
            self.add(node, ELEMENTWISE_MODULES[type(m)])
        elif isinstance(m, nn.Identity):
            self.alias(node)
        elif isinstance(m, nn.Flatten):
            self.flatten_or_alias(node)
        elif isinstance(m, nn.Embedding):
            source = self.owner.get(id(m.weight))
            self.module_parameters(m)
            self.add(node, "embedding", {"vocabulary": m.num_embeddings, "dim": m.embedding_dim,
                                         **({"tied_to": source} if source is not None else {})})
            if source is None:
                self.owner[id(m.weight)] = self.layers[-1]["name"]
        elif isinstance(m, nn.TransformerEncoderLayer):
            self.module_parameters(m)
            self.add(node, "transformer_block", {"heads": m.self_attn.num_heads, "ffn": m.linear1.out_features})
        elif isinstance(m, nn.MultiheadAttention) and len(set(node.all_input_nodes)) == 1:
            self.module_parameters(m)
            self.add(node, "attention", {"heads": m.num_heads})
        elif isinstance(m, nn.LSTM) and m.num_layers == 1 and m.batch_first:
            self.module_parameters(m)
            self.add(node, "lstm", {"hidden": m.hidden_size, "bidirectional": m.bidirectional})
        elif isinstance(m, nn.modules.conv._ConvNd):  # other convolutions: FLOPs from the shapes
            flops = 2.0 * (m.in_channels // m.groups) * math.prod(m.kernel_size) * numel(shape_of(node))
            self.custom_layer(node, f"module {type(m).__module__}.{type(m).__name__} (FLOPs from its shapes)",
                              module=m, flops=flops)
        else:
            self.custom_layer(node, f"module {type(m).__module__}.{type(m).__name__}", module=m)

    def plain_conv(self, m):
        return (m.kernel_size[0] == m.kernel_size[1] and m.stride[0] == m.stride[1] and
                isinstance(m.padding, tuple) and m.padding[0] == m.padding[1] and
                m.dilation == (1, 1) and m.padding_mode == "zeros")

    def plain_pool(self, m):
        def square(v):
            return isinstance(v, int) or v[0] == v[1]
        dil = getattr(m, "dilation", 1)
        return (square(m.kernel_size) and square(m.stride) and square(m.padding) and dil in (1, (1, 1)) and
                not getattr(m, "ceil_mode", False))

    def flatten_or_alias(self, node):
        out = shape_of(node)
        src = node.all_input_nodes[0]
        if out is not None and len(out) == 1 and shape_of(src) is not None and len(shape_of(src)) > 1:
            self.add(node, "flatten", inputs=self.tensor_inputs(node)[:1])
        else:
            self.alias(node)

    def function(self, node):
        t = node.target
        if node.op == "call_function" and t is operator.getitem and node.args and \
                self.value.get(node.args[0], ("const",))[0] == "layer":
            self.alias(node)  # an element of a layer's tuple output (LSTM, attention): that layer
            return
        if shape_of(node) is None:  # sizes, getattr, Python values: no layer
            self.value[node] = ("const", None)
            return
        tensor_args = [a for a in node.all_input_nodes if self.value.get(a, ("const",))[0] == "layer"]
        param_args = [a for a in node.all_input_nodes if self.value.get(a, ("const",))[0] == "param"]
        if node.op == "call_method" and t in ALIAS_METHODS or node.op == "call_function" and t in ALIAS_FUNCTIONS:
            if t in ("flatten", "view", "reshape", torch.flatten, torch.reshape):
                self.flatten_or_alias(node)
            else:
                self.alias(node)
            return
        if node.op == "call_function" and t in ADD_FUNCTIONS or node.op == "call_method" and t in ("add", "add_"):
            if param_args:  # a learned table added (position embeddings): its parameters, no FLOPs
                self.custom_layer(node, None, extra_params=sum(self.value[a][1] for a in param_args))
                self.notes.append(f"{self.layers[-1]['name']}: a parameter tensor added: custom layer "
                                  f"holding its {sum(self.value[a][1] for a in param_args)} parameters")
                return
            if len(tensor_args) >= 2 and all(shape_of(a) == shape_of(node) for a in tensor_args):
                self.add(node, "add")
                return
            if len(tensor_args) == 1:
                self.add(node, "elementwise")
                return
        if node.op == "call_function" and t in ELEMENTWISE_FUNCTIONS and len(tensor_args) <= 1 and not param_args:
            if tensor_args:
                self.add(node, ELEMENTWISE_FUNCTIONS[t])
            else:
                self.value[node] = ("const", None)
            return
        if node.op == "call_method" and t in ("relu", "sigmoid", "tanh", "mul", "div", "sub") and len(tensor_args) == 1:
            self.add(node, "relu" if t == "relu" else "elementwise")
            return
        if node.op == "call_function" and t in CONCAT_FUNCTIONS:
            dim = node.kwargs.get("dim", node.args[1] if len(node.args) > 1 else 0)
            out = shape_of(node)
            if dim in (-1, len(out)) and len(tensor_args) >= 2:
                self.add(node, "concat")
                return
        if (node.op == "call_function" and t in (torch.matmul, torch.bmm, operator.matmul) or
                node.op == "call_method" and t in ("matmul", "bmm")) and len(node.all_input_nodes) == 2:
            a = shape_of(node.all_input_nodes[0])
            flops = 2.0 * numel(shape_of(node)) * (a[-1] if a else 1)
            self.custom_layer(node, f"{node.op} matmul (FLOPs from its shapes)",
                              extra_params=sum(self.value[a][1] for a in param_args), flops=flops)
            return
        if not tensor_args:  # arange, zeros, ...: constants
            self.value[node] = ("const", None)
            return
        name = t if isinstance(t, str) else getattr(t, "__name__", str(t))
        self.custom_layer(node, f"{node.op} {name}", extra_params=sum(self.value[a][1] for a in param_args))

    # --- output -----------------------------------------------------------------------------
    def yaml_lines(self, name, measured=None, batch=None):
        lines = [f"name: {json.dumps(name)}", "precision: fp32", "layers:"]
        previous = None
        for layer in self.layers:
            keys = {k: v for k, v in layer.items() if k not in ("name", "kind", "inputs") and not k.startswith("_")}
            kind = layer["kind"]
            if measured is not None and kind != "input":
                t = measured[layer["name"]]
                keys = {"output_shape": layer["_out"], "stash": f"{numel(layer['_out']) * self.bytes}B",
                        "forward": f"{t[0] * 1e6:.6f}us", "backward": f"{t[1] * 1e6:.6f}us", "batch": batch}
                p = layer.get("_params", 0)
                if p:
                    keys["parameters"] = p
                kind = "custom"
            fields = [f"name: {json.dumps(layer['name'])}", f"kind: {kind}"]
            if kind != "input" and layer["inputs"] != ([previous] if previous else []):
                fields.append(f"inputs: {yaml_value(layer['inputs'])}")
            fields += [f"{k}: {yaml_value(v)}" for k, v in keys.items()]
            lines.append("  - {" + ", ".join(fields) + "}")
            previous = layer["name"]
        return lines


def layer_parameters(importer):
    """Parameters per layer (each tensor counted once, in the first layer that uses it)."""
    seen = set()
    for layer in importer.layers:
        n = 0
        layer["_tensors"] = []
        for node in layer["_nodes"]:
            if node.op == "call_module":
                for p in importer.gm.get_submodule(node.target).parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        layer["_tensors"].append(p)
                        n += p.numel()
            for a in node.all_input_nodes:
                if a.op == "get_attr":
                    attr = importer.gm
                    for part in a.target.split("."):
                        attr = getattr(attr, part)
                    if isinstance(attr, nn.Parameter) and id(attr) not in seen:
                        seen.add(id(attr))
                        layer["_tensors"].append(attr)
                        n += attr.numel()
        layer["_params"] = n


def measure(importer, recorded, device, repeat):
    """Forward and backward seconds of each layer: its traced operations re-run on its recorded
    inputs (median of `repeat` runs after a warm-up)."""
    gm = importer.gm
    times = {}

    def run_node(node, env):
        def get(a):
            return env[a] if a in env else recorded.get(a, a)
        args = torch.fx.node.map_arg(node.args, get)
        kwargs = torch.fx.node.map_arg(node.kwargs, get)
        if node.op == "call_module":
            return gm.get_submodule(node.target)(*args, **kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        if node.op == "get_attr":
            return recorded[node]
        raise RuntimeError(node.op)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for layer in importer.layers:
        if layer["kind"] == "input":
            continue
        nodes = layer["_nodes"]
        group = set(nodes)
        externals = []
        for n in nodes:
            for a in n.all_input_nodes:
                if a not in group and isinstance(recorded.get(a), torch.Tensor) and a not in externals:
                    externals.append(a)
        f_s, b_s = [], []
        for i in range(repeat + 1):
            env = {}
            for a in externals:
                x = recorded[a].detach()
                if x.is_floating_point():
                    x = x.clone().requires_grad_(True)
                env[a] = x
            sync()
            t0 = time.perf_counter()
            out = None
            with torch.enable_grad():
                for n in nodes:
                    out = run_node(n, env)
                    env[n] = out
            sync()
            t1 = time.perf_counter()
            if isinstance(out, tuple):
                out = out[0]
            backward = 0.0
            if isinstance(out, torch.Tensor) and out.requires_grad:
                grad = torch.randn_like(out)
                sync()
                t2 = time.perf_counter()
                out.backward(grad)
                sync()
                backward = time.perf_counter() - t2
            if i > 0:
                f_s.append(t1 - t0)
                b_s.append(backward)
        times[layer["name"]] = (statistics.median(f_s), statistics.median(b_s))
    return times


def record_values(gm, x):
    recorded = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)
            recorded[n] = r.detach() if isinstance(r, torch.Tensor) else r
            return r

    with torch.no_grad():
        Recorder(gm).run(x)
    return recorded


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def check_paths(args):
    """No output may be an input (--file) or another output (compared as canonical paths)."""
    def same(a, b):
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    inputs = [("--file", args.file)] if args.file else []
    outputs = [(k, v) for k, v in (("-o", args.output), ("--report", args.report), ("--profile", args.profile)) if v]
    for i, (what, path) in enumerate(outputs):
        for in_what, in_path in inputs:
            if same(path, in_path):
                fail(f"{what} \"{path}\" is the {in_what} model: an output must not overwrite an input")
        for other, other_path in outputs[:i]:
            if same(path, other_path):
                fail(f"{other} \"{other_path}\" and {what} \"{path}\" are the same file: each output needs its own")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="pipegrid import", description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--torchvision", metavar="NAME", help="a torchvision.models builder, e.g. resnet50")
    src.add_argument("--file", metavar="MODEL.py", help="a Python file defining the nn.Module class")
    ap.add_argument("--class", dest="cls", metavar="NAME", help="the class in --file")
    ap.add_argument("--kwargs", metavar="JSON", help="keyword arguments of the constructor, as a JSON object")
    ap.add_argument("--input-shape", required=True, metavar="D1,D2,...", help="one sample's input shape")
    ap.add_argument("--input-dtype", choices=["auto", "float", "long"], default="auto",
                    help="long for token ids (auto: long when the input feeds an nn.Embedding)")
    ap.add_argument("--name", help="the model's name (default: the class or torchvision name)")
    ap.add_argument("-o", "--output", metavar="FILE", help="the model file to write (default: standard output)")
    ap.add_argument("--report", metavar="FILE", help="write the report here instead of standard error")
    ap.add_argument("--profile", metavar="FILE", help="also time every layer here and write a measured profile")
    ap.add_argument("--batch", type=int, default=8, help="samples per measured forward/backward (--profile)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per layer, median kept (--profile)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where --profile measures")
    ap.add_argument("--threads", type=int, default=0, help="torch threads for --profile (0: torch's default)")
    args = ap.parse_args(argv)
    if args.file and not args.cls:
        fail("--file needs --class NAME")
    try:
        shape = [int(d) for d in args.input_shape.split(",")]
        if not shape or min(shape) < 1:
            raise ValueError
    except ValueError:
        fail(f"--input-shape: expected positive dimensions like 3,224,224, got \"{args.input_shape}\"")
    if args.batch < 1 or args.repeat < 1:
        fail("--batch and --repeat must be positive")
    if args.threads < 0:
        fail(f"--threads: expected 0 (torch's default) or a positive count, got {args.threads}")
    check_paths(args)

    torch.manual_seed(0)
    model, default_name = load_module(args)
    name = args.name or default_name
    try:
        graph = Tracer().trace(model)
    except Exception as e:
        fail(f"torch.fx cannot trace {default_name}: {one_line(e)}")
    gm = torch.fx.GraphModule(model, graph)
    x, dtype = example_input(model, gm, shape, args.input_dtype, 2)
    model.eval()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints the traceback itself
            ShapeProp(gm).propagate(x)
    except Exception as e:
        # ShapeProp's own error wraps the operation's (raised while handling it)
        fail(f"running {default_name} on an input of shape {[2] + shape} ({dtype}) failed: "
             f"{one_line(e.__cause__ or e.__context__ or e)}")

    imp = Importer(model, gm)
    imp.run()
    layer_parameters(imp)
    torch_params = sum(p.numel() for p in model.parameters())
    file_params = sum(l["_params"] for l in imp.layers)

    text = "\n".join(imp.yaml_lines(name)) + "\n"
    header = (f"# Imported from PyTorch by `pipegrid import` (tools/torch_import.py), torch {torch.__version__}: "
              f"{default_name}, input {shape} ({dtype})\n")
    if args.output:
        with open(args.output, "w") as f:
            f.write(header + text)
    else:
        sys.stdout.write(header + text)

    report = [f"{name}: {len(imp.layers)} layers, {torch_params:,} parameters in torch, "
              f"{file_params:,} in the file"]
    if imp.custom:
        report.append(f"{len(imp.custom)} operations imported as custom layers (bytes from shapes; FLOPs only where "
                      f"the line says so):")
        report += [f"  {n}: {why}" for n, why in imp.custom]
    else:
        report.append("no custom layers: every operation mapped to a pipegrid layer kind")
    report += imp.notes

    if args.profile:
        if args.device == "cuda" and not torch.cuda.is_available():
            fail("--device cuda: no CUDA device")
        if args.threads:
            torch.set_num_threads(args.threads)
        model.train()
        model.to(args.device)
        xb, _ = example_input(model, gm, shape, dtype, args.batch)
        recorded = record_values(gm, xb.to(args.device))
        times = measure(imp, recorded, args.device, args.repeat)
        where = torch.cuda.get_device_name() if args.device == "cuda" else cpu_name()
        lines = imp.yaml_lines(name, measured=times, batch=args.batch)
        with open(args.profile, "w") as f:
            f.write(f"# Measured profile written by `pipegrid import --profile` (tools/torch_import.py)\n"
                    f"# device: {args.device}: {where}; torch {torch.__version__}, {torch.get_num_threads()} threads\n"
                    f"# precision: fp32; batch: {args.batch} samples per measured forward/backward; "
                    f"median of {args.repeat} runs per layer\n"
                    f"# forward: {sum(t[0] for t in times.values()) * 1e3:.3f} ms, "
                    f"backward: {sum(t[1] for t in times.values()) * 1e3:.3f} ms in all\n")
            f.write("\n".join(lines) + "\n")
        report.append(f"profile: {args.profile} ({args.device}: {where}, batch {args.batch}, fp32)")

    used = {id(p) for l in imp.layers for p in l["_tensors"]}
    unused = [(n, p.numel()) for n, p in model.named_parameters() if id(p) not in used]
    if unused:
        report.append(f"{sum(c for _, c in unused):,} parameters the forward never uses are not in the file: "
                      + ", ".join(f"{n} ({c:,})" for n, c in unused))
    out = open(args.report, "w") if args.report else sys.stderr
    out.write("\n".join(report) + "\n")
    if file_params + sum(c for _, c in unused) != torch_params:
        fail(f"the file holds {file_params:,} parameters, torch {torch_params:,}", status=1)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # one line, not a traceback, whatever went wrong
        fail(one_line(e))

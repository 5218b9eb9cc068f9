"""In-test backends, exposed through fake entry points by test_dispatch.py."""

from __future__ import annotations

import os
import threading

import torch

import rlk
from rlk.ops.logp import native as native_logp
from rlk.ops.policy_loss import native as native_policy_loss

RLK_PLUGIN_API = "2.0"
calls: dict[str, int] = {"fast": 0, "check": 0, "with_grad": 0, "loss_backward": 0}


def fast_forward(*args, **kwargs):
    calls["fast"] += 1
    return native_logp.forward(*args, **kwargs)


def exploding_forward(*args, **kwargs):
    raise RuntimeError("kernel launch failed: illegal memory access")


def count_check(*, temperature, **_):
    calls["check"] += 1
    return "per-row temperature is not supported" if isinstance(temperature, torch.Tensor) else None


class Fast:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("fast", priority=50, version="1")
        registry.add_kernel("logp", "fast", "fake_plugins:fast_forward",
                            backward="rlk.ops.logp.native:backward", devices=("cpu",),
                            dtypes=(torch.float32,), check=count_check,
                            properties=("batch_invariant",))


class Picky:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("picky", priority=60, probe=lambda d: "needs a picky device")
        registry.add_kernel("logp", "picky", "fake_plugins:fast_forward", devices=("cpu",))


class Exploding:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("exploding", priority=70)
        registry.add_kernel("logp", "exploding", "fake_plugins:exploding_forward",
                            devices=("cpu",))


class Duplicate:
    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("native", priority=1000)


fast, picky, exploding, duplicate = Fast(), Picky(), Exploding(), Duplicate()
for plugin in (fast, picky, exploding, duplicate):
    plugin.RLK_PLUGIN_API = RLK_PLUGIN_API  # type: ignore[attr-defined]


# --- plugins that misbehave while loading (test_loader.py) ------------------------------


class Reentrant:
    """Calls rlk from inside its hook, as a plugin checking itself might."""

    seen: list[object] = []

    @rlk.hookimpl
    def rlk_register(self, registry):
        self.seen.append(rlk.logp(torch.zeros(1, 3), torch.zeros(1, dtype=torch.long)))
        self.seen.append([b.name for b in rlk.backends("cpu")])
        registry.add_backend("reentrant", priority=5)


class Hijacker:
    """Tries to replace native's probe through its registry, then fails."""

    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.backends["native"].probe = lambda device: "hijacked"
        raise RuntimeError("hook failed after meddling")


class Annexer:
    """Adds a kernel to a backend another plugin (Fast) declared."""

    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_kernel("sample", "fast", "fake_plugins:fast_forward", devices=("cpu",))


class Exiting:
    @rlk.hookimpl
    def rlk_register(self, registry):
        raise SystemExit(3)


class Interrupting:
    """Ctrl-C while its hook runs, the first time only."""

    interrupts = 1

    @rlk.hookimpl
    def rlk_register(self, registry):
        if Interrupting.interrupts > 0:
            Interrupting.interrupts -= 1
            raise KeyboardInterrupt
        registry.add_backend("interrupting", priority=5)


class Slow:
    delay = 0.0

    @rlk.hookimpl
    def rlk_register(self, registry):
        import time

        time.sleep(self.delay)
        registry.add_backend("slow", priority=5)


class Future:
    """Written for a newer minor plugin API than core speaks."""

    @rlk.hookimpl
    def rlk_register(self, registry):
        registry.add_backend("future", priority=5)


class Hookless:
    """Declares an API version but implements no hook."""

    def rlk_register(self, registry):  # not marked with hookimpl
        registry.add_backend("hookless", priority=5)


# --- kernels that break their contract (test_contract.py, test_selection.py) --------------


def float64_forward(**kwargs):
    logp, entropy, lse = native_logp.forward(**kwargs)
    return logp.double(), entropy, lse


def short_forward(**kwargs):
    logp, entropy, lse = native_logp.forward(**kwargs)
    return logp[1:], entropy, lse


def none_forward(**kwargs):
    return None


def scribbling_forward(*args, **kwargs):
    """Right results, then the caller's logits and tokens zeroed."""
    result = native_logp.forward(*args, **kwargs)
    for tensor in (*args[:2], kwargs.get("logits"), kwargs.get("tokens")):
        if tensor is not None:
            tensor.zero_()
    return result


def nan_forward(*args, **kwargs):
    logp, entropy, lse = native_logp.forward(*args, **kwargs)
    return logp.clone().fill_(float("nan")), entropy, lse


def cold_forward(*args, **kwargs):
    """A logp kernel that ignores the temperature: right at T = 1 only."""
    names = ("logits", "tokens", "temperature", "ignore_index", "rows", "out", "with_entropy")
    return native_logp.forward(**{**dict(zip(names, args, strict=False)), **kwargs,
                                  "temperature": 1.0})


def aliasing_forward(*args, **kwargs):
    """logits[:, 0]: the right shape and dtype, but the caller's own memory."""
    _, entropy, lse = native_logp.forward(*args, **kwargs)
    logits = kwargs["logits"] if "logits" in kwargs else args[0]
    return logits[:, 0], entropy, lse


def false_check(**_):
    return False


def empty_check(**_):
    return ""


def raising_probe(device):
    raise OSError("cannot read /dev/faraway")


# --- policy_loss kernels whose forward can also give the gradient (test_policy_loss.py) ----


def loss_forward(**args):
    return native_policy_loss.forward(**args)


def loss_backward(grad_loss, **args):
    calls["loss_backward"] += 1
    return native_policy_loss.backward(grad_loss, **args)


def _with_grad(**args):
    """native's loss and metrics, and its gradient at upstream 1 in float32."""
    calls["with_grad"] += 1
    grad = native_policy_loss.backward(torch.ones(()), **dict(args, logp=args["logp"].float()))
    return (*native_policy_loss.forward(**args), grad)


def bad_loss_forward(**args):
    return native_policy_loss.forward(**args)


loss_forward.with_grad = _with_grad  # type: ignore[attr-defined]
# the gradient in logp's dtype: the contract of with_grad is float32
bad_loss_forward.with_grad = lambda **args: (  # type: ignore[attr-defined]
    *native_policy_loss.forward(**args), native_policy_loss.backward(torch.ones(()), **args))


def _single_kernel_plugin(name: str, forward: str, *, backward: str | None = None,
                          check=None, probe=None, priority: int = 90, op: str = "logp"):
    class Plugin:
        @rlk.hookimpl
        def rlk_register(self, registry):
            registry.add_backend(name, priority=priority, probe=probe, version="1")
            registry.add_kernel(op, name, forward, backward=backward, devices=("cpu",),
                                check=check)

    plugin = Plugin()
    plugin.RLK_PLUGIN_API = RLK_PLUGIN_API  # type: ignore[attr-defined]
    return plugin


nobackward = _single_kernel_plugin("nobackward", "fake_plugins:fast_forward")
float64 = _single_kernel_plugin("float64", "fake_plugins:float64_forward",
                                backward="rlk.ops.logp.native:backward")
short = _single_kernel_plugin("short", "fake_plugins:short_forward")
noneresult = _single_kernel_plugin("noneresult", "fake_plugins:none_forward")
scribbling = _single_kernel_plugin("scribbling", "fake_plugins:scribbling_forward")
nanresult = _single_kernel_plugin("nanresult", "fake_plugins:nan_forward")
aliasing = _single_kernel_plugin("aliasing", "fake_plugins:aliasing_forward")
cold = _single_kernel_plugin("cold", "fake_plugins:cold_forward",
                             backward="rlk.ops.logp.native:backward")
falsecheck = _single_kernel_plugin("falsecheck", "fake_plugins:fast_forward", check=false_check)
emptycheck = _single_kernel_plugin("emptycheck", "fake_plugins:fast_forward", check=empty_check)
badprobe = _single_kernel_plugin("badprobe", "fake_plugins:fast_forward", probe=raising_probe)
withgrad = _single_kernel_plugin("withgrad", "fake_plugins:loss_forward", op="policy_loss",
                                 backward="fake_plugins:loss_backward")
badwithgrad = _single_kernel_plugin("badwithgrad", "fake_plugins:bad_loss_forward",
                                    op="policy_loss", backward="fake_plugins:loss_backward")

class Stalling:
    """Holds its hook in the parent process until released (a fork arrives meanwhile)."""

    parent = os.getpid()
    started, release = threading.Event(), threading.Event()

    @rlk.hookimpl
    def rlk_register(self, registry):
        if os.getpid() == self.parent:
            self.started.set()
            self.release.wait(60)
        registry.add_backend("stalling", priority=3)


stalling = Stalling()
stalling.RLK_PLUGIN_API = RLK_PLUGIN_API  # type: ignore[attr-defined]
reentrant, hijacker, annexer, exiting = Reentrant(), Hijacker(), Annexer(), Exiting()
interrupting, slow, future, hookless = Interrupting(), Slow(), Future(), Hookless()
for plugin in (reentrant, hijacker, annexer, exiting, interrupting, slow, hookless):
    plugin.RLK_PLUGIN_API = RLK_PLUGIN_API  # type: ignore[attr-defined]
future.RLK_PLUGIN_API = "2.7"  # type: ignore[attr-defined]

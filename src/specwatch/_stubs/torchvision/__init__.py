"""Import stub for torchvision, for the CPU tier only (see specwatch/sglang_host.py).

SGLang's ``sglang/srt/utils/common.py`` imports ``torchvision.io.decode_jpeg`` at module level,
and transformers' image utilities import more of torchvision when it looks installed. PyPI's
torchvision wheels need a CUDA build of torch, which CI must not install. The CPU tier never
touches images, so this stub makes every ``torchvision.*`` module importable and every name in
it a placeholder that raises on use.
"""

import importlib.abc
import importlib.machinery
import sys
import types

from torchvision._missing import module_getattr

__version__ = "0.0.0+specwatch.stub"
__getattr__ = module_getattr("torchvision")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision.") and fullname != "torchvision._missing":
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name)
        mod.__path__ = []
        mod.__getattr__ = module_getattr(spec.name)
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.append(_StubFinder())

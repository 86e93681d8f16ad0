"""A placeholder for any torchvision name: importable, fails on use."""


class Missing:
    def __init__(self, name: str):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"torchvision stub (specwatch CPU tier): {self._name} is not available")

    def __getattr__(self, attr):
        return Missing(f"{self._name}.{attr}")

    def __mro_entries__(self, bases):
        return (object,)


def module_getattr(module: str):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(f"{module}.{name}")

    return __getattr__

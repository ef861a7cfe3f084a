def load_ipython_extension(ipython):
    pass


def unload_ipython_extension(ipython):
    pass

"""Web framework integrations: ``aiolock.integrations.fastapi`` and ``.aiohttp``.

Each is an optional extra (``aiolock[fastapi]``, ``aiolock[aiohttp]``) and is imported only
by name: neither this package nor ``aiolock`` itself imports a framework.
"""

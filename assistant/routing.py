"""WebSocket routes. The live dashboard consumer arrives with the dashboard work."""

websocket_urlpatterns: list = []

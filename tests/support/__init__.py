"""What the tests share: servers, processes, proxies, a browser and the fronts."""

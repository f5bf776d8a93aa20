"""``python -m torchlens.frontends.ranks.autoattach`` prints the directory
(``DIR``): the other nodes' command of ``torchlens run`` puts it first on
``PYTHONPATH`` there, so their ranks attach at start too, wherever torchlens
is installed on that machine."""

from torchlens.frontends.ranks.autoattach import DIR

print(DIR)

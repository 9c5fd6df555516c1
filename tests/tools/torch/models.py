"""Models built from torch.nn layers for tests/tools/torch_import_test.py."""
import torch
from torch import nn


class TinyGPT(nn.Module):
    """The zoo's `gpt` (core/models/zoo.cc) in torch.nn: token embedding, a learned position table,
    pre-norm Transformer blocks with a 4h GELU feed-forward, a final LayerNorm and a head tied to
    the token embedding."""

    def __init__(self, layers=2, hidden=64, heads=4, sequence=32, vocabulary=1000):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, hidden)
        self.positions = nn.Parameter(torch.zeros(sequence, hidden))
        self.blocks = nn.Sequential(*[
            nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, dropout=0.0, activation="gelu",
                                       batch_first=True, norm_first=True) for _ in range(layers)])
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocabulary, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, ids):
        x = self.tokens(ids) + self.positions
        return self.head(self.norm(self.blocks(x)))


class SmallNet(nn.Module):
    """A small convolutional network with a residual branch and an operation pipegrid has no kind
    for (a 2x nearest upsampling), for the profile and custom-layer tests."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = y + self.conv2(y)
        y = self.up(self.pool(self.pool(y)))
        return self.fc(torch.flatten(y, 1))

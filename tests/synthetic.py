"""A synthetic parallel corpus for the tests, so that they need no data folder: seeded English
image captions and their German translations from a small grammar, laid out as
SEQ2SEQ_DATA_DIR is (`multi30k/<split>.<lang>.gz`, `wmt14/newstest20NN.<lang>` and the
newstest2014 SGML files).

The German follows the English word for word with real inflection (gender, case, number) and
compounds ("bike shop": "Fahrradladen"), so a tiny model learns it in a few dozen steps. The
vocabulary supports a sentencepiece model of 1000 pieces (the tiny config's; up to 1300), and
sentences are about as long as Multi30k's (11.7 English words). `python tests/synthetic.py DIR`
writes the folder.
"""

from __future__ import annotations

import gzip
import html
import pathlib

import numpy as np

# Split sizes (Multi30k's are 29000 / 1014 / 1000 / 1000; newstest's 3000 / 3003).
MULTI30K = {"train": 6000, "val": 300, "test_2016_flickr": 200, "test_2017_flickr": 200}
NEWSTEST = {"newstest2013": 200, "newstest2014": 200}

# English singular, English plural, German singular, German plural, German gender.
def _nouns(table: str) -> list[list[str]]:
  return [entry.split("|") for entry in table.split()]


PEOPLE = _nouns("""
man|men|Mann|Männer|m  woman|women|Frau|Frauen|f  child|children|Kind|Kinder|n  boy|boys|Junge|Jungen|m
girl|girls|Mädchen|Mädchen|n  dog|dogs|Hund|Hunde|m  cat|cats|Katze|Katzen|f  horse|horses|Pferd|Pferde|n
bird|birds|Vogel|Vögel|m  worker|workers|Arbeiter|Arbeiter|m  player|players|Spieler|Spieler|m
musician|musicians|Musiker|Musiker|m  cook|cooks|Koch|Köche|m  doctor|doctors|Ärztin|Ärztinnen|f
teacher|teachers|Lehrerin|Lehrerinnen|f  tourist|tourists|Tourist|Touristen|m  baby|babies|Baby|Babys|n
farmer|farmers|Bauer|Bauern|m  dancer|dancers|Tänzerin|Tänzerinnen|f  student|students|Student|Studenten|m
""")
THINGS = _nouns("""
bike|bikes|Fahrrad|Fahrräder|n  book|books|Buch|Bücher|n  ball|balls|Ball|Bälle|m  car|cars|Auto|Autos|n
boat|boats|Boot|Boote|n  guitar|guitars|Gitarre|Gitarren|f  hat|hats|Hut|Hüte|m  shirt|shirts|Hemd|Hemden|n
jacket|jackets|Jacke|Jacken|f  camera|cameras|Kamera|Kameras|f  sign|signs|Schild|Schilder|n
flag|flags|Fahne|Fahnen|f  bag|bags|Tasche|Taschen|f  cup|cups|Tasse|Tassen|f  kite|kites|Drachen|Drachen|m
sandwich|sandwiches|Brot|Brote|n  umbrella|umbrellas|Schirm|Schirme|m  drum|drums|Trommel|Trommeln|f
newspaper|newspapers|Zeitung|Zeitungen|f  picture|pictures|Bild|Bilder|n  rope|ropes|Seil|Seile|n
""")
PLACES = _nouns("""
wall|walls|Mauer|Mauern|f  street|streets|Straße|Straßen|f  house|houses|Haus|Häuser|n
field|fields|Feld|Felder|n  beach|beaches|Strand|Strände|m  river|rivers|Fluss|Flüsse|m
tree|trees|Baum|Bäume|m  bench|benches|Bank|Bänke|f  stage|stages|Bühne|Bühnen|f  shop|shops|Laden|Läden|m
kitchen|kitchens|Küche|Küchen|f  mountain|mountains|Berg|Berge|m  park|parks|Park|Parks|m
fountain|fountains|Brunnen|Brunnen|m  bridge|bridges|Brücke|Brücken|f  window|windows|Fenster|Fenster|n
table|tables|Tisch|Tische|m  lake|lakes|See|Seen|m  market|markets|Markt|Märkte|m  city|cities|Stadt|Städte|f
""")

# English, German stem (the inflected forms add an ending to it).
ADJECTIVES = [a.split("|") for a in """
red|rot  blue|blau  green|grün  yellow|gelb  black|schwarz  white|weiß  brown|braun  orange|orangefarben
small|klein  large|groß  young|jung  old|alt  happy|fröhlich  tired|müd  wet|nass  dirty|schmutzig
busy|belebt  quiet|ruhig  crowded|voll  wooden|hölzern  colorful|bunt  striped|gestreift  long|lang
short|kurz  heavy|schwer  new|neu  empty|leer  dark|dunkl  bright|hell  tall|hoh  pretty|hübsch
""".split()]

# English -ing form, German 3rd person singular, German plural.
TRANSITIVE = [v.split("|") for v in """
riding|fährt|fahren  reading|liest|lesen  holding|hält|halten  carrying|trägt|tragen  throwing|wirft|werfen
catching|fängt|fangen  pushing|schiebt|schieben  pulling|zieht|ziehen  watching|beobachtet|beobachten
painting|malt|malen  playing|spielt|spielen  cleaning|putzt|putzen  repairing|repariert|reparieren
selling|verkauft|verkaufen  buying|kauft|kaufen  washing|wäscht|waschen  kicking|tritt|treten
photographing|fotografiert|fotografieren  eating|isst|essen  finding|findet|finden
""".split()]
INTRANSITIVE = [v.split("|") for v in """
walking|geht|gehen  running|läuft|laufen  sitting|sitzt|sitzen  standing|steht|stehen  dancing|tanzt|tanzen
singing|singt|singen  jumping|springt|springen  sleeping|schläft|schlafen  waiting|wartet|warten
laughing|lacht|lachen  climbing|klettert|klettern  swimming|schwimmt|schwimmen  working|arbeitet|arbeiten
resting|ruht|ruhen  smiling|lächelt|lächeln  talking|spricht|sprechen
""".split()]
PREPOSITIONS = [p.split("|") for p in "in|in  on|auf  near|neben  behind|hinter  in front of|vor  under|unter".split("  ")]

# German articles and adjective endings by case, gender (or plural) and article kind.
ARTICLES = {("nom", "def"): {"m": "der", "f": "die", "n": "das", "pl": "die"},
            ("nom", "indef"): {"m": "ein", "f": "eine", "n": "ein"},
            ("acc", "def"): {"m": "den", "f": "die", "n": "das", "pl": "die"},
            ("acc", "indef"): {"m": "einen", "f": "eine", "n": "ein"},
            ("dat", "def"): {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
            ("dat", "indef"): {"m": "einem", "f": "einer", "n": "einem"}}
ENDINGS = {("nom", "def"): {"m": "e", "f": "e", "n": "e", "pl": "en"},
           ("nom", "indef"): {"m": "er", "f": "e", "n": "es"},
           ("acc", "def"): {"m": "en", "f": "e", "n": "e", "pl": "en"},
           ("acc", "indef"): {"m": "en", "f": "e", "n": "es"},
           ("dat", "def"): {"m": "en", "f": "en", "n": "en", "pl": "en"},
           ("dat", "indef"): {"m": "en", "f": "en", "n": "en"}}
NUMBERS = [("two", "zwei"), ("three", "drei"), ("four", "vier"), ("several", "mehrere")]


def _plural(noun: str, case: str) -> str:
  """A German plural noun in `case`: the dative adds -n unless it ends in -n or -s."""
  return noun + "n" if case == "dat" and noun[-1] not in "ns" else noun


class Grammar:
  """Sentence pairs drawn with a numpy generator; every choice is made once for both sides."""

  def __init__(self, rng: np.random.Generator):
    self.rng = rng

  def pick(self, items):
    return items[self.rng.integers(len(items))]

  def noun(self, nouns) -> list[str]:
    """[English singular, English plural, German singular, German plural, gender] of a noun,
    half of them compounds ("bike shop", German "Fahrradladen": one long word)."""
    noun = self.pick(nouns)
    if self.rng.random() < 0.5:
      modifier = self.pick([m for m in THINGS + PLACES if m is not noun])
      noun = [f"{modifier[0]} {noun[0]}", f"{modifier[0]} {noun[1]}", modifier[2] + noun[2].lower(),
              modifier[2] + noun[3].lower(), noun[4]]
    return noun

  def noun_phrase(self, nouns, case: str) -> tuple[str, str, bool]:
    """(English, German, plural) of a noun phrase: article or number, an adjective or none, noun."""
    en_sg, en_pl, de_sg, de_pl, gender = self.noun(nouns)
    adjectives = [self.pick(ADJECTIVES) for _ in range(int(self.rng.random() < 0.4))]
    plural, definite = self.rng.random() < 0.3, self.rng.random() < 0.4
    if plural and not definite:  # "two red balls": German adjectives take the strong ending
      number_en, number_de = self.pick(NUMBERS)
      ending = {"nom": "e", "acc": "e", "dat": "en"}[case]
      en = [number_en, *(a for a, _ in adjectives), en_pl]
      de = [number_de, *(g + ending for _, g in adjectives), _plural(de_pl, case)]
      return " ".join(en), " ".join(de), True
    kind, key = ("def" if definite else "indef"), ("pl" if plural else gender)
    en = ["the" if definite else ("an" if (adjectives[0][0] if adjectives else en_sg)[0] in "aeiou" else "a"),
          *(a for a, _ in adjectives), en_pl if plural else en_sg]
    de = [ARTICLES[case, kind][key], *(g + ENDINGS[case, kind][key] for _, g in adjectives),
          _plural(de_pl, case) if plural else de_sg]
    return " ".join(en), " ".join(de), plural

  def place(self) -> tuple[str, str]:
    prep_en, prep_de = self.pick(PREPOSITIONS)
    en, de, _ = self.noun_phrase(PLACES, "dat")
    return f"{prep_en} {en}", f"{prep_de} {de}"

  def clause(self) -> tuple[str, str]:
    subject_en, subject_de, plural = self.noun_phrase(PEOPLE, "nom")
    be = "are" if plural else "is"
    if self.rng.random() < 0.6:
      ing, sg, pl = self.pick(TRANSITIVE)
      object_en, object_de, _ = self.noun_phrase(THINGS, "acc")
      en, de = [subject_en, be, ing, object_en], [subject_de, pl if plural else sg, "gerade", object_de]
    else:
      ing, sg, pl = self.pick(INTRANSITIVE)
      en, de = [subject_en, be, ing], [subject_de, pl if plural else sg, "gerade"]
    if self.rng.random() < 0.7:
      place_en, place_de = self.place()
      en.append(place_en)
      de.append(place_de)
    return " ".join(en), " ".join(de)

  def sentence(self, clauses: int) -> tuple[str, str]:
    parts = [self.clause() for _ in range(clauses)]
    en = " and ".join(p[0] for p in parts)
    de = " und ".join(p[1] for p in parts)
    return en[0].upper() + en[1:] + ".", de[0].upper() + de[1:] + "."


def pairs(count: int, seed: int, clauses: float = 1.2) -> list[tuple[str, str]]:
  """`count` seeded (English, German) pairs of `clauses` clauses on average (1 + Poisson)."""
  grammar = Grammar(np.random.default_rng(seed))
  return [grammar.sentence(1 + int(grammar.rng.poisson(clauses - 1))) for _ in range(count)]


def write(root: str | pathlib.Path) -> pathlib.Path:
  """Writes the synthetic data folder into `root` and returns it."""
  root = pathlib.Path(root)
  (root / "multi30k").mkdir(parents=True, exist_ok=True)
  (root / "wmt14").mkdir(parents=True, exist_ok=True)
  for seed, (split, count) in enumerate(MULTI30K.items()):
    split_pairs = pairs(count, seed)
    for side, lang in enumerate(("en", "de")):
      text = "".join(p[side] + "\n" for p in split_pairs).encode()
      (root / "multi30k" / f"{split}.{lang}.gz").write_bytes(gzip.compress(text, mtime=0))  # the same bytes each time
  for seed, (name, count) in enumerate(NEWSTEST.items(), start=len(MULTI30K)):
    split_pairs = pairs(count, seed, clauses=2.0)  # news sentences are longer
    split_pairs[1] = ('The "Smith & Sons" shop is <closed>.', 'Der Laden „Smith & Sons" ist <geschlossen>.')
    for side, lang in enumerate(("en", "de")):
      (root / "wmt14" / f"{name}.{lang}").write_text("".join(p[side] + "\n" for p in split_pairs), encoding="utf-8")
    if name == "newstest2014":  # the official release is SGML, one <seg> per line
      for side, (lang, kind) in enumerate((("en", "src"), ("de", "ref"))):
        segs = "".join(f'<seg id="{i + 1}">{html.escape(p[side], quote=False)}</seg>\n'
                       for i, p in enumerate(split_pairs))
        (root / "wmt14" / f"newstest2014-deen-{kind}.{lang}.sgm").write_text(
            f'<{kind}set setid="newstest2014" srclang="any">\n<doc sysid="{kind}" docid="1" genre="news">\n'
            f"{segs}</doc>\n</{kind}set>\n", encoding="utf-8")
  return root


if __name__ == "__main__":
  import sys

  print(write(sys.argv[1]))

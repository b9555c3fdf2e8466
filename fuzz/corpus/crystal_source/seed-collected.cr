# memprof's fixture for collected objects by class (tests/tests/classes.rs):
# makes 20,000 Widget (scanned memory), 5,000 Gadget (scanned) and 3,000
# Sprocket (no pointers: atomic memory), each held from a root until all
# are made (no object dies, no address is reused before), keeps the first
# 500 Widget and 100 Gadget, drops the rest, and collects once. Then it
# asks the collector about each object it made (addresses kept in malloc
# memory, which the collector does not scan) and prints, with C stdio (no
# allocation, no collection after), one line per class:
#   <class> <allocated> <collected> <live>
# where collected = not marked by that collection (the truth memprof's
# verdicts must match: a conservative collector may keep a dropped one).

lib LibCollected
  fun is_marked = GC_is_marked(p : Void*) : Int32
  fun base = GC_base(p : Void*) : Void*
  fun printf(format : UInt8*, ...) : Int32
  fun fflush(file : Void*) : Int32
end

class Widget
  @a = 1
  @b = "x"
end

class Gadget
  def initialize(@n : Int32, @name : String)
  end
end

class Sprocket
  def initialize(@n : Int32, @m : Int64)
  end
end

WIDGETS  = 20_000
GADGETS  =  5_000
SPROCKET =  3_000

class Keep
  class_property widgets : Array(Widget)? = nil
  class_property gadgets : Array(Gadget)? = nil
end

@[NoInline]
def make_widgets(all : Array(Widget), addrs : UInt64*)
  WIDGETS.times do |i|
    w = Widget.new
    addrs[i] = w.object_id
    all << w
  end
end

@[NoInline]
def make_gadgets(all : Array(Gadget), addrs : UInt64*)
  GADGETS.times do |i|
    g = Gadget.new(i, "g")
    addrs[i] = g.object_id
    all << g
  end
end

@[NoInline]
def make_sprockets(all : Array(Sprocket), addrs : UInt64*)
  SPROCKET.times do |i|
    s = Sprocket.new(i, i.to_i64)
    addrs[i] = s.object_id
    all << s
  end
end

# Marked objects among `addrs[0, n]` (those the collection kept).
def live(addrs : UInt64*, n : Int32) : Int32
  count = 0
  n.times do |i|
    p = Pointer(Void).new(addrs[i])
    count += 1 if LibCollected.base(p) == p && LibCollected.is_marked(p) != 0
  end
  count
end

@[NoInline]
def make_and_drop(widget_addrs, gadget_addrs, sprocket_addrs)
  widgets = Array(Widget).new(WIDGETS)
  gadgets = Array(Gadget).new(GADGETS)
  sprockets = Array(Sprocket).new(SPROCKET)
  make_widgets(widgets, widget_addrs)
  make_gadgets(gadgets, gadget_addrs)
  make_sprockets(sprockets, sprocket_addrs)
  Keep.widgets = widgets[0, 500]
  Keep.gadgets = gadgets[0, 100]
  # Zeroes the buffers: the dropped objects are referenced nowhere.
  widgets.clear
  gadgets.clear
  sprockets.clear
end

widget_addrs = LibC.malloc(WIDGETS * 8).as(UInt64*)
gadget_addrs = LibC.malloc(GADGETS * 8).as(UInt64*)
sprocket_addrs = LibC.malloc(SPROCKET * 8).as(UInt64*)
make_and_drop(widget_addrs, gadget_addrs, sprocket_addrs)
GC.collect
{% for c in [{"Widget", "widget_addrs", "WIDGETS"}, {"Gadget", "gadget_addrs", "GADGETS"}, {"Sprocket", "sprocket_addrs", "SPROCKET"}] %}
  n = {{c[2].id}}
  l = live({{c[1].id}}, n)
  LibCollected.printf("%s %d %d %d\n", {{c[0]}}, n, n - l, l)
{% end %}
LibCollected.fflush(nil)

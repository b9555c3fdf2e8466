# The crystal_source target's seed (make-seeds.sh): what memprof reads of
# a source for an inlined `new`: nested types, generics, class methods,
# instance variables typed or constructed, locals constructed.
module Outer(T)
  struct Pair(A, B)
    def initialize(@a : A, @b : B)
    end
  end

  abstract class Base < Reference
    @counts = Hash(String, Int32).new
    @hash : Hash(T, Nil)

    def self.new(size : Int32)
      instance = allocate
      instance
    end

    def initialize(@hash : Hash(T, Nil))
    end

    def push(x)
      list = [] of Node
      map = {} of String => Array(Int32)
      list << Node.new(x)
      @counts.merge!(map)
      @hash.clear
    end
  end

  class Node<Base
    def initialize(@value : Int32)
    end
  end
end
